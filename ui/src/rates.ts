// Live rates from the controller's `GET /v1/io`: each look gives every attached volume's
// request counters since its export started; two looks give a rate. The last RATE_POINTS
// rates of each volume are kept in this tab's memory only (a reload starts afresh).

import { ClusterIo, OpCounters, VolumeIo } from "./api";

/// 60 looks, two minutes at the dashboard's 2 s polling.
export const RATE_POINTS = 60;

export interface Rate {
  at_ms: number;
  iops: number;
  /// Mean request latency over the interval, milliseconds; null without requests.
  latency_ms: number | null;
  bytes_per_sec: number;
}

interface Last {
  at_ms: number;
  counters: VolumeIo;
}

const ops = (c: VolumeIo): OpCounters[] => [c.read, c.write, c.flush, c.other];
const sum = (c: VolumeIo, f: (o: OpCounters) => number) => ops(c).reduce((a, o) => a + f(o), 0);

export class Rates {
  private last = new Map<string, Last>();
  private series = new Map<string, Rate[]>();

  /// Takes one look. A volume whose export restarted (another node, or a new start) begins
  /// a new series; one no longer attached is forgotten.
  add(io: ClusterIo) {
    const seen = new Set<string>();
    for (const c of io.volumes) {
      seen.add(c.volume);
      const prev = this.last.get(c.volume);
      this.last.set(c.volume, { at_ms: io.at_ms, counters: c });
      if (!prev || prev.counters.node !== c.node || prev.counters.started_ms !== c.started_ms) {
        this.series.set(c.volume, []);
        continue;
      }
      const dt = (io.at_ms - prev.at_ms) / 1000;
      if (dt <= 0) continue;
      const requests = sum(c, (o) => o.requests) - sum(prev.counters, (o) => o.requests);
      const latency = sum(c, (o) => o.latency_sum_secs) - sum(prev.counters, (o) => o.latency_sum_secs);
      const moved = sum(c, (o) => o.bytes) - sum(prev.counters, (o) => o.bytes);
      const s = this.series.get(c.volume) ?? [];
      s.push({
        at_ms: io.at_ms,
        iops: Math.max(0, requests) / dt,
        latency_ms: requests > 0 ? (1000 * latency) / requests : null,
        bytes_per_sec: Math.max(0, moved) / dt,
      });
      if (s.length > RATE_POINTS) s.splice(0, s.length - RATE_POINTS);
      this.series.set(c.volume, s);
    }
    for (const v of [...this.last.keys()]) {
      if (!seen.has(v) && !io.unreachable.length) {
        this.last.delete(v);
        this.series.delete(v);
      }
    }
  }

  of(volume: string): Rate[] {
    return this.series.get(volume) ?? [];
  }
}

/// An SVG polyline's points for `values` in a `w` x `h` box (null values at the bottom).
export function sparkPoints(values: (number | null)[], w: number, h: number): string {
  if (values.length === 0) return "";
  const max = Math.max(...values.map((v) => v ?? 0), 1e-9);
  const step = values.length > 1 ? w / (RATE_POINTS - 1) : 0;
  const x0 = w - step * (values.length - 1);
  return values
    .map((v, i) => `${(x0 + i * step).toFixed(1)},${(h - 1 - ((v ?? 0) / max) * (h - 2)).toFixed(1)}`)
    .join(" ");
}
