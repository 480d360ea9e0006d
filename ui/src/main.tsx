// Hawser's dashboard. Everything it shows comes from the controller's REST API with the
// admin token; everything user-controlled (names, messages, labels) is rendered as text by
// Preact, never as HTML. Polls every 2 s while the tab is visible.

import { render } from "preact";
import { useEffect, useState } from "preact/hooks";
import {
  ApiError,
  Backup,
  bytes,
  call,
  ClusterEvent,
  ClusterIo,
  Node,
  parseSize,
  Pool,
  Resync,
  setToken,
  Status,
  token,
  Volume,
} from "./api";
import { Rate, Rates, sparkPoints } from "./rates";

const POLL_MS = 2000;
/// Recent events shown, at most.
const EVENTS_SHOWN = 20;
/// Backups shown: every running one, then the newest others up to this many.
const BACKUPS_SHOWN = 10;

interface Snapshot {
  nodes: Node[];
  pools: Pool[];
  volumes: Volume[];
  status: Status;
  events: ClusterEvent[];
  backups: Backup[];
  at: Date;
}

/// The volumes' live rates, from every poll's look at `/v1/io`.
const rates = new Rates();

async function load(): Promise<Snapshot> {
  const [nodes, pools, volumes, status, io, events, backups] = await Promise.all([
    call<Node[]>("GET", "/v1/nodes"),
    call<Pool[]>("GET", "/v1/pools"),
    call<Volume[]>("GET", "/v1/volumes"),
    call<Status>("GET", "/v1/status"),
    call<ClusterIo>("GET", "/v1/io"),
    call<ClusterEvent[]>("GET", "/v1/events"),
    call<Backup[]>("GET", "/v1/backups"),
  ]);
  rates.add(io);
  return { nodes, pools, volumes, status, events, backups, at: new Date() };
}

function Login(props: { onDone: () => void; error: string | null }) {
  const [value, setValue] = useState("");
  const [error, setError] = useState<string | null>(props.error);
  const submit = async (e: Event) => {
    e.preventDefault();
    setToken(value.trim());
    try {
      await call("GET", "/v1/status");
      props.onDone();
    } catch (err) {
      setToken(null);
      setError(err instanceof Error ? err.message : String(err));
    }
  };
  return (
    <form class="login" onSubmit={submit}>
      <h1>Hawser</h1>
      <label>
        Admin token
        <input
          id="token"
          type="password"
          autocomplete="off"
          value={value}
          onInput={(e) => setValue((e.target as HTMLInputElement).value)}
        />
      </label>
      <p class="hint">The controller wrote it to admin.token in its data directory.</p>
      <button id="login" type="submit">
        Log in
      </button>
      {error && <p class="error">{error}</p>}
    </form>
  );
}

function Bar(props: { used: number; total: number; label: string }) {
  const pct = props.total > 0 ? Math.min(100, (100 * props.used) / props.total) : 0;
  return (
    <div class="bar" title={props.label}>
      <div class="fill" style={{ width: `${pct.toFixed(1)}%` }} />
      <span>{props.label}</span>
    </div>
  );
}

function Nodes(props: { s: Snapshot; act: Act }) {
  return (
    <section>
      <h2>Nodes</h2>
      <table id="nodes">
        <thead>
          <tr>
            <th>node</th>
            <th>state</th>
            <th>pools</th>
            <th />
          </tr>
        </thead>
        <tbody>
          {props.s.nodes.map((n) => (
            <tr key={n.name} data-node={n.name}>
              <td data-label="node">{n.name}</td>
              <td data-label="state" class={`state ${n.state}`}>
                {n.state}
                {n.evacuating ? " (evacuating)" : ""}
              </td>
              <td data-label="pools">
                {props.s.pools
                  .filter((p) => p.node === n.name)
                  .map((p) => (
                    <Bar
                      key={p.name}
                      used={p.capacity_bytes - p.free_bytes}
                      total={p.capacity_bytes}
                      label={`${p.name}: ${bytes(p.capacity_bytes - p.free_bytes)} of ${bytes(p.capacity_bytes)}, ${p.replicas} replicas`}
                    />
                  ))}
              </td>
              <td class="actions">
                {n.evacuating ? (
                  <button
                    onClick={() =>
                      props.act(`restore ${n.name}`, () =>
                        call("POST", `/v1/nodes/${n.name}/restore`),
                      )
                    }
                  >
                    restore
                  </button>
                ) : (
                  <button
                    onClick={() =>
                      props.act(
                        `evacuate ${n.name}`,
                        () => call("POST", `/v1/nodes/${n.name}/evacuate`),
                        `Evacuate ${n.name}? Its replicas are moved to other nodes.`,
                      )
                    }
                  >
                    evacuate
                  </button>
                )}
              </td>
            </tr>
          ))}
        </tbody>
      </table>
    </section>
  );
}

function Resyncs(props: { resyncs: Resync[] }) {
  if (props.resyncs.length === 0) return null;
  return (
    <section>
      <h2>Resyncs</h2>
      <table id="resyncs">
        <tbody>
          {props.resyncs.map((r) => {
            const total = r.copied_bytes + r.remaining_bytes;
            return (
              <tr key={r.replica} data-volume={r.volume}>
                <td>
                  {r.volume} → {r.node}
                </td>
                <td>{r.state}</td>
                <td>
                  <Bar
                    used={r.copied_bytes}
                    total={total}
                    label={`${bytes(r.copied_bytes)} of ${bytes(total)}${r.eta_secs !== null ? `, ${r.eta_secs} s left` : ""}`}
                  />
                </td>
              </tr>
            );
          })}
        </tbody>
      </table>
    </section>
  );
}

/// Backups (docs/backup.md): running ones with their progress (bytes, rate, ETA), then the
/// newest finished ones with their recovery point, or why they failed.
function Backups(props: { backups: Backup[] }) {
  if (props.backups.length === 0) return null;
  const running = props.backups.filter((b) => b.state === "running");
  const rest = props.backups
    .filter((b) => b.state !== "running")
    .sort((a, b) => b.created_ms - a.created_ms)
    .slice(0, Math.max(0, BACKUPS_SHOWN - running.length));
  return (
    <section>
      <h2>Backups</h2>
      <table id="backups">
        <tbody>
          {[...running, ...rest].map((b) => {
            const p = b.progress;
            const point = new Date(b.taken_ms).toISOString().replace(/\.\d+Z$/, "Z");
            let detail;
            if (b.state === "running" && p) {
              const rate = p.bytes_per_sec > 0 ? `, ${bytes(p.bytes_per_sec)}/s` : "";
              const eta = p.eta_secs !== null ? `, ${p.eta_secs} s left` : "";
              detail = (
                <Bar
                  used={p.done_bytes}
                  total={p.total_bytes}
                  label={`${bytes(p.done_bytes)} of ${bytes(p.total_bytes)}${rate}${eta}`}
                />
              );
            } else if (b.state === "failed") {
              detail = <span class="error">{b.error ?? "failed"}</span>;
            } else {
              const sent = b.stats ? `, ${bytes(b.stats.stored_bytes)} stored` : "";
              detail = `recovery point ${point}${sent}`;
            }
            return (
              <tr key={b.name} data-backup={b.name} data-state={b.state}>
                <td>
                  {b.volume} → {b.target}
                </td>
                <td>{b.name}</td>
                <td>{b.state}</td>
                <td>{detail}</td>
              </tr>
            );
          })}
        </tbody>
      </table>
    </section>
  );
}

type Act = (what: string, run: () => Promise<unknown>, confirm?: string) => void;

/// IOPS and mean latency over the last two minutes, as sparklines, and their latest values.
function Io(props: { rates: Rate[] }) {
  const r = props.rates;
  const now = r.length ? r[r.length - 1] : null;
  const [w, h] = [120, 22];
  return (
    <div>
      <div class="spark-row">
        <svg class="spark iops" viewBox={`0 0 ${w} ${h}`} width={w} height={h} role="img" aria-label="IOPS">
          <polyline points={sparkPoints(r.map((x) => x.iops), w, h)} />
        </svg>
        <span class="iops-now">{now ? `${Math.round(now.iops)} IOPS` : "measuring…"}</span>
      </div>
      <div class="spark-row">
        <svg class="spark latency" viewBox={`0 0 ${w} ${h}`} width={w} height={h} role="img" aria-label="latency">
          <polyline points={sparkPoints(r.map((x) => x.latency_ms), w, h)} />
        </svg>
        <span class="latency-now">
          {now?.latency_ms != null ? `${now.latency_ms.toFixed(2)} ms` : "–"}
        </span>
      </div>
    </div>
  );
}

function Events(props: { events: ClusterEvent[] }) {
  if (props.events.length === 0) return null;
  return (
    <section>
      <h2>Recent events</h2>
      <table id="events">
        <tbody>
          {props.events.slice(0, EVENTS_SHOWN).map((e) => (
            <tr key={e.seq} data-reason={e.reason} class={e.warning ? "warning" : ""}>
              <td data-label="time">{new Date(e.at_ms).toLocaleTimeString()}</td>
              <td data-label="event" class="reason">
                {e.reason}
              </td>
              <td data-label="on">{e.volume ? `volume ${e.volume}` : e.node ? `node ${e.node}` : "cluster"}</td>
              <td data-label="">{e.message}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </section>
  );
}

function Volumes(props: { s: Snapshot; act: Act }) {
  const online = props.s.nodes.filter((n) => n.state === "online").map((n) => n.name);
  return (
    <section>
      <h2>Volumes</h2>
      <table id="volumes">
        <thead>
          <tr>
            <th>volume</th>
            <th>size</th>
            <th>state</th>
            <th>replicas</th>
            <th>epoch</th>
            <th>I/O, last 2 min</th>
            <th />
          </tr>
        </thead>
        <tbody>
          {props.s.volumes.map((v) => {
            const inSync = v.replicas.filter((r) => r.state === "in_sync").length;
            const degraded = inSync < v.replica_count;
            return (
              <tr key={v.name} data-volume={v.name} class={degraded ? "degraded" : ""}>
                <td data-label="volume">{v.name}</td>
                <td data-label="size">{bytes(v.size_bytes)}</td>
                <td data-label="state">
                  {v.state}
                  {v.attached_node ? ` on ${v.attached_node}` : ""}
                </td>
                <td data-label="replicas">
                  <span class="count">
                    {inSync}/{v.replica_count} in sync
                  </span>
                  {v.replicas.map((r) => (
                    <span key={r.id} class={`replica ${r.engine?.state ?? r.state}`}>
                      {r.node}: {r.engine?.state ?? r.state}
                    </span>
                  ))}
                </td>
                <td data-label="epoch">{v.epoch}</td>
                <td data-label="I/O" class="io">
                  {v.state === "attached" && <Io rates={rates.of(v.name)} />}
                </td>
                <td class="actions">
                  {v.state === "detached" &&
                    online.map((n) => (
                      <button
                        key={n}
                        onClick={() =>
                          props.act(`attach ${v.name} on ${n}`, () =>
                            call("POST", `/v1/volumes/${v.name}/attach`, { node: n }),
                          )
                        }
                      >
                        attach on {n}
                      </button>
                    ))}
                  {v.state === "attached" && (
                    <button
                      onClick={() =>
                        props.act(
                          `detach ${v.name}`,
                          () => call("POST", `/v1/volumes/${v.name}/detach`),
                          `Detach ${v.name}? Clients using it lose it.`,
                        )
                      }
                    >
                      detach
                    </button>
                  )}
                  <button
                    class="danger"
                    data-action="delete"
                    onClick={() =>
                      props.act(
                        `delete ${v.name}`,
                        () => call("DELETE", `/v1/volumes/${v.name}`),
                        `Delete ${v.name} and all its data? This cannot be undone.`,
                      )
                    }
                  >
                    delete
                  </button>
                </td>
              </tr>
            );
          })}
        </tbody>
      </table>
    </section>
  );
}

function CreateVolume(props: { act: Act }) {
  const [name, setName] = useState("");
  const [size, setSize] = useState("1GiB");
  const [replicas, setReplicas] = useState("2");
  const submit = (e: Event) => {
    e.preventDefault();
    props.act(`create ${name}`, async () => {
      const size_bytes = parseSize(size);
      if (size_bytes === null) throw new Error(`${size} is not a size (e.g. 1GiB, 512MiB)`);
      return call("POST", "/v1/volumes", { name, size_bytes, replicas: Number(replicas) });
    });
  };
  return (
    <form class="create" onSubmit={submit}>
      <h2>New volume</h2>
      <input
        id="new-name"
        placeholder="name"
        value={name}
        onInput={(e) => setName((e.target as HTMLInputElement).value)}
      />
      <input
        id="new-size"
        value={size}
        onInput={(e) => setSize((e.target as HTMLInputElement).value)}
      />
      <select
        id="new-replicas"
        value={replicas}
        onChange={(e) => setReplicas((e.target as HTMLSelectElement).value)}
      >
        {["1", "2", "3"].map((n) => (
          <option key={n} value={n}>
            {n} replica{n === "1" ? "" : "s"}
          </option>
        ))}
      </select>
      <button id="create" type="submit">
        create
      </button>
    </form>
  );
}

function Dashboard(props: { onLogout: (why: string | null) => void }) {
  const [snap, setSnap] = useState<Snapshot | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [message, setMessage] = useState<string | null>(null);
  const [tick, setTick] = useState(0);
  useEffect(() => {
    let stopped = false;
    const poll = async () => {
      try {
        const s = await load();
        if (!stopped) {
          setSnap(s);
          setError(null);
        }
      } catch (err) {
        if (err instanceof ApiError && err.status === 401) {
          props.onLogout("The token is no longer valid.");
          return;
        }
        if (!stopped) setError(err instanceof Error ? err.message : String(err));
      }
    };
    poll();
    const timer = setInterval(() => {
      if (document.visibilityState === "visible") poll();
    }, POLL_MS);
    return () => {
      stopped = true;
      clearInterval(timer);
    };
  }, [tick]);
  const act: Act = async (what, run, confirmText) => {
    if (confirmText && !window.confirm(confirmText)) return;
    try {
      await run();
      setMessage(`${what}: done`);
    } catch (err) {
      setMessage(`${what}: ${err instanceof Error ? err.message : String(err)}`);
    }
    setTick((t) => t + 1);
  };
  return (
    <main>
      <header>
        <h1>Hawser</h1>
        {snap && (
          <span id="summary">
            {snap.status.nodes - snap.status.nodes_offline.length}/{snap.status.nodes} nodes
            online, {snap.status.volumes} volumes, {snap.status.degraded.length} degraded
          </span>
        )}
        <button onClick={() => props.onLogout(null)}>log out</button>
      </header>
      {error && <p class="error">{error}</p>}
      {message && (
        <p id="message" class="message">
          {message}
        </p>
      )}
      {snap && (
        <>
          <Nodes s={snap} act={act} />
          <Resyncs resyncs={snap.status.resyncs} />
          <Volumes s={snap} act={act} />
          <Backups backups={snap.backups} />
          <Events events={snap.events} />
        </>
      )}
      <CreateVolume act={act} />
    </main>
  );
}

function App() {
  const [loggedIn, setLoggedIn] = useState(token() !== null);
  const [why, setWhy] = useState<string | null>(null);
  if (!loggedIn) return <Login onDone={() => setLoggedIn(true)} error={why} />;
  return (
    <Dashboard
      onLogout={(reason) => {
        setToken(null);
        setWhy(reason);
        setLoggedIn(false);
      }}
    />
  );
}

const root = document.getElementById("app");
if (root) render(<App />, root);
