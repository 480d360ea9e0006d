// The controller's REST API as the dashboard uses it: the admin token (kept in this tab's
// sessionStorage only) as a bearer token on every call, JSON both ways, and the API's
// `{code, message}` errors turned into exceptions with the message.

export type ReplicaState = "in_sync" | "outdated" | "failed";

export interface EngineReplica {
  replica_id: string;
  state: string;
  connected: boolean;
  dirty_bytes: number;
  copied_bytes: number;
  resync_bytes_per_sec?: number;
}

export interface Replica {
  id: string;
  node: string;
  pool: string;
  state: ReplicaState;
  blank?: boolean;
  engine?: EngineReplica;
}

export interface Volume {
  name: string;
  size_bytes: number;
  replica_count: number;
  thin: boolean;
  state: string;
  epoch: number;
  attached_node: string | null;
  replicas: Replica[];
}

export interface Node {
  name: string;
  state: string;
  last_seen_ms: number;
  evacuating: boolean;
  labels: Record<string, string>;
}

export interface Pool {
  node: string;
  name: string;
  capacity_bytes: number;
  free_bytes: number;
  provisioned_bytes: number;
  replicas: number;
}

export interface Resync {
  volume: string;
  replica: string;
  node: string;
  blank: boolean;
  state: string;
  copied_bytes: number;
  remaining_bytes: number;
  bytes_per_sec: number;
  eta_secs: number | null;
}

export interface Status {
  nodes: number;
  nodes_offline: string[];
  nodes_evacuating: string[];
  volumes: number;
  degraded: { name: string; in_sync: number; replica_count: number; lagging: string[] }[];
  resyncs: Resync[];
}

export interface OpCounters {
  requests: number;
  bytes: number;
  errors: number;
  latency_sum_secs: number;
}

export interface VolumeIo {
  volume: string;
  node: string;
  started_ms: number;
  read: OpCounters;
  write: OpCounters;
  flush: OpCounters;
  other: OpCounters;
  in_flight: number;
}

export interface ClusterIo {
  at_ms: number;
  volumes: VolumeIo[];
  unreachable: string[];
}

export interface BackupProgress {
  total_bytes: number;
  done_bytes: number;
  transferred_bytes: number;
  bytes_per_sec: number;
  eta_secs: number | null;
}

/// `GET /v1/backups` (docs/backup.md).
export interface Backup {
  name: string;
  volume: string;
  target: string;
  state: "running" | "ready" | "failed";
  taken_ms: number;
  size_bytes: number;
  node?: string | null;
  progress?: BackupProgress | null;
  stats?: { stored_bytes: number; new_blocks: number; reused_blocks: number } | null;
  error?: string | null;
  created_ms: number;
}

export interface ClusterEvent {
  seq: number;
  at_ms: number;
  warning: boolean;
  reason: string;
  volume?: string;
  node?: string;
  message: string;
}

const TOKEN_KEY = "hawser.token";

export function token(): string | null {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function setToken(t: string | null) {
  if (t === null) sessionStorage.removeItem(TOKEN_KEY);
  else sessionStorage.setItem(TOKEN_KEY, t);
}

export class ApiError extends Error {
  constructor(
    public status: number,
    message: string,
  ) {
    super(message);
  }
}

export async function call<T>(method: string, path: string, body?: unknown): Promise<T> {
  const headers: Record<string, string> = { Authorization: `Bearer ${token() ?? ""}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const resp = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (resp.status === 204) return undefined as T;
  const text = await resp.text();
  let json: unknown = null;
  try {
    json = text ? JSON.parse(text) : null;
  } catch {
    throw new ApiError(resp.status, `HTTP ${resp.status}: not JSON`);
  }
  if (!resp.ok) {
    const msg = (json as { message?: string } | null)?.message ?? `HTTP ${resp.status}`;
    throw new ApiError(resp.status, msg);
  }
  return json as T;
}

/// `1073741824` -> `1.0 GiB`.
export function bytes(n: number): string {
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let i = 0;
  let v = n;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return i === 0 ? `${v} B` : `${v.toFixed(1)} ${units[i]}`;
}

/// `"1GiB"`, `"512MiB"`, `"1G"` (binary units, as the CLI takes them) or plain bytes; null if
/// it is none of these.
export function parseSize(s: string): number | null {
  const m = /^\s*(\d+(?:\.\d+)?)\s*([KMGTP]?)(i?B)?\s*$/i.exec(s);
  if (!m) return null;
  const power = " KMGTP".indexOf(m[2].toUpperCase() || " ");
  const n = Number(m[1]) * 1024 ** power;
  return Number.isSafeInteger(Math.round(n)) ? Math.round(n) : null;
}
