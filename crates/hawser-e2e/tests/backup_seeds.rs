//! Seeded interleavings of backups, restores, a standby's applies, backup deletes and prunes,
//! with agents and the controller killed (-9) and started again in between (issue 61, item 7,
//! acceptance f). Each seed draws an op list from its own PRNG and runs it on one cluster (two
//! agents) and one real S3 server (SeaweedFS), both shared by every seed: the ops are the
//! seed's, the timing is the machine's. Jobs are started, not waited for, so they overlap the
//! ops after them. Once every volume of the seed has settled with no operator action (within
//! [`SETTLE`]), nothing may differ from what the test kept:
//! - every backup with a manifest on the target (each one listed `ready`, and any other)
//!   restores, from the test, to the SHA-256 the volume had when it was taken;
//! - every volume created `--from-backup` is `detached`, each replica holding its backup;
//! - the standby holds, on each replica, the backup it says it applied;
//! - the source volume keeps no snapshot its backups took.
//!
//! The previous seed's backups stay on the target through the next seed, whose prunes (grace
//! 0) must keep what they name: every seed writes the same first block, so the two share an
//! object. They are checked again at its end, then deleted.
//!
//! `make test` runs seeds 1 to 50 (`HAWSER_INTERLEAVE_COUNT`). Once, 2000, every failing
//! seed listed at the end (docs/backup.md, Tests):
//!
//! ```sh
//! HAWSER_INTERLEAVE_COUNT=2000 HAWSER_INTERLEAVE_KEEP_GOING=1 \
//!     HAWSER_BIN=$PWD/target/release/hawser \
//!     cargo test --release -p hawser-e2e --test backup_seeds -- --nocapture
//! ```
//!
//! A failing seed prints its op list and what each op did; `HAWSER_INTERLEAVE_SEEDS=17` (or
//! `17,42`) replays it, `HAWSER_INTERLEAVE_SEED_FROM=1000` starts the count elsewhere, and
//! `HAWSER_INTERLEAVE_VERBOSE=1` prints each op as it runs.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::process::Output;
use std::time::{Duration, Instant};

use hawser_api::backup::{Backup, BackupState};
use hawser_api::controller::{Snapshot, Volume, VolumeState};
use hawser_backup::Target;
use hawser_e2e::api::Api;
use hawser_e2e::cluster::{hawser_bin, Cluster, ClusterOptions};
use hawser_e2e::compare::{sha256_hex, sha256_of};
use hawser_e2e::{qemu_io, within, S3Server, TempDir};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const MIB: u64 = 1 << 20;
/// Each seed's source volume: four backup blocks of 1 MiB, so that a write changes one block
/// and a backup sends one or two.
const SIZE: u64 = 4 * MIB;
const AGENTS: [&str; 2] = ["n1", "n2"];
/// How long a seed's backups, restores and standby may take to settle once its ops are done.
/// A restore whose node was down is tried again after a backoff (5 s, then 10 s, ...), and
/// an agent is never down for more than a few ops.
const SETTLE: Duration = Duration::from_secs(60);
/// How long a restore or a delete waits for the backup it names to end: a backup here ends
/// within about a second (the controller reads its job each second), also one whose
/// controller was restarted (a new one follows running backups within a second); one that
/// has not, the op goes on without (its refusal is an outcome like any other).
const ENDED_WITHIN: Duration = Duration::from_secs(3);
/// Ops a seed draws, besides its first write and backup.
const OPS: std::ops::RangeInclusive<usize> = 6..=10;
/// Every seed's first write: the same block 0 in every seed's first backup, one object on
/// the target for all of them.
const SHARED_WRITE: Op = Op::Write {
    at: 0,
    len: 64 << 10,
    pattern: 0xa5,
};

/// One step of a seed.
#[derive(Clone, Copy, Debug)]
enum Op {
    /// qemu-io on the source volume: `pattern` over `len` bytes at `at` (0: `write -z`).
    Write { at: u64, len: u64, pattern: u8 },
    /// `hawser backup create` of the source, not waited for.
    Backup,
    /// `volume create --from-backup` of the seed's backup number `of` (modulo how many).
    Restore { of: usize, replicas: u32 },
    /// `volume create --standby-of offsite/<source>` (once a seed).
    Standby { replicas: u32 },
    /// `hawser backup delete` of the seed's backup number `of`.
    Delete { of: usize },
    /// `hawser backup target prune offsite`.
    Prune,
    /// kill -9 of agent `AGENTS[agent]` (the source detached from it first).
    Kill { agent: usize },
    /// The killed agent started again.
    Revive { agent: usize },
    /// kill -9 of the controller, started again on the same store: at once (`now`: it meets
    /// whatever runs, backups and prunes too), or once the seed's backups have ended, so
    /// that it meets restores, applies and prunes.
    RestartController { now: bool },
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Op::Write { at, len, pattern } => write!(f, "write {pattern:#04x} {at}+{len}"),
            Op::Backup => write!(f, "backup"),
            Op::Restore { of, replicas } => write!(f, "restore #{of} x{replicas}"),
            Op::Standby { replicas } => write!(f, "standby x{replicas}"),
            Op::Delete { of } => write!(f, "delete #{of}"),
            Op::Prune => write!(f, "prune"),
            Op::Kill { agent } => write!(f, "kill {}", AGENTS[agent]),
            Op::Revive { agent } => write!(f, "revive {}", AGENTS[agent]),
            Op::RestartController { now: true } => write!(f, "restart controller now"),
            Op::RestartController { now: false } => write!(f, "restart controller"),
        }
    }
}

fn listed(ops: &[Op]) -> String {
    ops.iter().map(Op::to_string).collect::<Vec<_>>().join(", ")
}

/// Seed `seed`'s ops. An agent killed is started again within three ops, and always before
/// the end; nothing writes while one is down (the source's other replica would miss it), and
/// what creates a volume then asks for one replica.
fn ops_of(seed: u64) -> Vec<Op> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut ops = vec![SHARED_WRITE, Op::Backup];
    let want = ops.len() + rng.random_range(OPS);
    // The agent down, and how many ops until it is started again.
    let mut down: Option<(usize, u32)> = None;
    let (mut standby, mut restores) = (false, 0);
    while ops.len() < want {
        if let Some((agent, 0)) = down {
            ops.push(Op::Revive { agent });
            down = None;
            continue;
        }
        let replicas = if down.is_some() { 1 } else { 2 };
        let op = match rng.random_range(0..100) {
            0..26 if down.is_none() => random_write(&mut rng),
            0..46 => Op::Backup,
            46..58 if restores < 2 => {
                restores += 1;
                let of = rng.random_range(0..8);
                let replicas = rng.random_range(1..=replicas);
                Op::Restore { of, replicas }
            }
            58..64 if !standby => {
                standby = true;
                Op::Standby { replicas }
            }
            58..74 => Op::Delete {
                of: rng.random_range(0..8),
            },
            74..84 => Op::Prune,
            84..95 if down.is_none() => {
                let agent = rng.random_range(0..AGENTS.len());
                down = Some((agent, rng.random_range(0..3) + 1));
                Op::Kill { agent }
            }
            95..100 => Op::RestartController {
                now: rng.random_range(0..2) == 0,
            },
            // A roll that does not fit now (a third restore, a second kill): roll again.
            _ => continue,
        };
        if let Some((_, left)) = &mut down {
            *left -= 1;
        }
        ops.push(op);
    }
    if let Some((agent, _)) = down {
        ops.push(Op::Revive { agent });
    }
    ops
}

/// 4 KiB to 64 KiB of one byte (zeros one time in eight) somewhere in the volume.
fn random_write(rng: &mut StdRng) -> Op {
    let pages = SIZE / 4096;
    let len = rng.random_range(1..=16u64) * 4096;
    let at = rng.random_range(0..pages - len / 4096) * 4096;
    let pattern = if rng.random_range(0..8) == 0 {
        0
    } else {
        rng.random_range(1..=255)
    };
    Op::Write { at, len, pattern }
}

/// A backup the test made: what its volume held when it was taken.
struct Made {
    sha: String,
    /// The index, among this test's seeds, of the one that made it.
    run: usize,
}

/// The cluster, the S3 server and what every seed so far made (fields drop in order).
struct World {
    c: Cluster,
    api: Api,
    _s3: S3Server,
    dir: TempDir,
    target: Target,
    rt: tokio::runtime::Runtime,
    known: BTreeMap<String, Made>,
    /// The agent killed and not started again yet.
    down: Option<usize>,
    /// What each op of the seed running now did, for its report.
    log: Vec<String>,
}

impl World {
    fn start() -> World {
        let args = [
            "--backup-prune-grace-secs",
            "0",
            "--standby-poll-secs",
            "1",
            // A backup on a killed agent fails within seconds, not 15.
            "--node-timeout-secs",
            "5",
            "--backup-rate",
            "1073741824",
        ];
        let opts = ClusterOptions {
            controller_args: args.map(String::from).to_vec(),
            ..Default::default()
        };
        let c = Cluster::start_with("seeds", AGENTS.len(), opts);
        let dir = TempDir::new("seeds-s3");
        let s3 = S3Server::start(dir.path(), "backups");
        s3.add_to(&c, "offsite", "cluster-1");
        World {
            api: Api::of(&c),
            target: s3.target("offsite", "cluster-1", 30),
            rt: tokio::runtime::Runtime::new().expect("runtime"),
            c,
            _s3: s3,
            dir,
            known: BTreeMap::new(),
            down: None,
            log: Vec::new(),
        }
    }

    /// Starts the killed agent again, if one is down.
    fn revive(&mut self) {
        if let Some(a) = self.down.take() {
            self.c.restart_agent_from(AGENTS[a], &hawser_bin(), false);
        }
    }

    fn get<T: serde::de::DeserializeOwned>(&self, path: &str) -> T {
        self.api.get(path).unwrap_or_else(|e| panic!("{e}"))
    }

    fn backups(&self, query: &str) -> Vec<Backup> {
        self.get(&format!("/v1/backups?{query}"))
    }

    /// The backups whose manifest is on the target (not retired).
    fn manifests(&self) -> BTreeSet<String> {
        let objects = self
            .rt
            .block_on(self.target.list(hawser_backup::names::BACKUPS))
            .expect("list the target's manifests");
        objects
            .iter()
            .filter_map(|o| o.strip_prefix("backups/")?.strip_suffix(".json"))
            .map(str::to_owned)
            .collect()
    }
}

/// What a CLI run said: its output, or its first line of error, which must say something.
fn outcome(args: &[&str], out: Output) -> Result<String, String> {
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let first = err.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    assert!(!first.is_empty(), "hawser {args:?} failed saying nothing");
    Err(first.trim().to_owned())
}

/// One seed's state as its ops run.
struct Seed<'w> {
    w: &'w mut World,
    n: u64,
    run: usize,
    src: String,
    /// What the source volume holds.
    image: Vec<u8>,
    /// The seed's backups, oldest first.
    backups: Vec<String>,
    /// Volumes created from a backup, with it.
    restores: Vec<(String, String)>,
    standby: Option<String>,
    /// The agent the source is attached on, and its NBD URI there.
    attached: Option<(usize, String)>,
}

impl<'w> Seed<'w> {
    fn new(w: &'w mut World, n: u64, run: usize) -> Seed<'w> {
        let src = format!("s{n}-v");
        let size = format!("{}MiB", SIZE / MIB);
        w.c.cli_ok(&["volume", "create", &src, "--size", &size, "--replicas", "2"]);
        Seed {
            w,
            n,
            run,
            src,
            image: vec![0; usize::try_from(SIZE).expect("a size")],
            backups: Vec::new(),
            restores: Vec::new(),
            standby: None,
            attached: None,
        }
    }

    fn cli(&self, args: &[&str]) -> Result<String, String> {
        outcome(args, self.w.c.cli(args))
    }

    /// Runs `op`; says what it did.
    fn apply(&mut self, op: Op) -> String {
        match op {
            Op::Write { at, len, pattern } => self.write(at, len, pattern),
            Op::Backup => self.backup(),
            Op::Restore { of, replicas } => self.restore(of, replicas),
            Op::Standby { replicas } => self.make_standby(replicas),
            Op::Delete { of } => self.delete(of),
            Op::Prune => said(self.cli(&["backup", "target", "prune", "offsite", "-o", "json"])),
            Op::Kill { agent } => self.kill(agent),
            Op::Revive { .. } => {
                self.w.revive();
                "registered again".into()
            }
            Op::RestartController { now } => {
                if !now {
                    for i in 0..self.backups.len() {
                        self.ended(i);
                    }
                }
                self.w.c.restart_controller(0);
                self.w.c.wait_leader(Duration::from_secs(30));
                "leads again".into()
            }
        }
    }

    /// The source's NBD URI, attached on the first agent up if it is not.
    fn uri(&mut self) -> String {
        if let Some((_, uri)) = &self.attached {
            return uri.clone();
        }
        let agent = (0..AGENTS.len())
            .find(|a| Some(*a) != self.w.down)
            .expect("an agent up");
        let src = self.src.clone();
        self.w
            .c
            .cli_ok(&["volume", "attach", &src, "--node", AGENTS[agent]]);
        let v: Volume = self.w.get(&format!("/v1/volumes/{src}"));
        let uri = v.nbd_unix_uri.expect("an attached volume's NBD URI");
        self.attached = Some((agent, uri.clone()));
        uri
    }

    fn write(&mut self, at: u64, len: u64, pattern: u8) -> String {
        let uri = self.uri();
        let cmd = match pattern {
            0 => format!("write -z {at} {len}"),
            p => format!("write -P {p} {at} {len}"),
        };
        qemu_io(&uri, &[&cmd, "flush"]);
        let at = usize::try_from(at).expect("an offset");
        let len = usize::try_from(len).expect("a length");
        self.image[at..at + len].fill(pattern);
        "written".into()
    }

    /// Starts a backup. Every backup of the source the test does not know yet was made by
    /// this call (its snapshot taken before it answered; nothing writes meanwhile), a failed
    /// one too: it holds what the volume holds now.
    fn backup(&mut self) -> String {
        let said = self.cli(&["backup", "create", &self.src, "--target", "offsite"]);
        let sha = sha256_hex(&self.image);
        let mut made = Vec::new();
        for b in self.w.backups(&format!("volume={}", self.src)) {
            if !self.w.known.contains_key(&b.name) {
                let run = self.run;
                let sha = sha.clone();
                self.w.known.insert(b.name.clone(), Made { sha, run });
                self.backups.push(b.name.clone());
                made.push(format!("#{} {}", self.backups.len() - 1, b.name));
            }
        }
        format!("{}; made {made:?}", said_short(said))
    }

    /// The seed's backup number `of` (modulo how many), once it ended (or `ENDED_WITHIN`
    /// passed), with its state then.
    fn ended(&self, of: usize) -> Option<(String, String)> {
        let name = self.backups.get(of % self.backups.len().max(1))?.clone();
        let mut state = String::from("gone");
        within(ENDED_WITHIN, || {
            let now: Result<Backup, String> = self.w.api.get(&format!("/v1/backups/{name}"));
            state = now.map_or("gone".into(), |b| format!("{:?}", b.state));
            state != "Running"
        });
        Some((name, state))
    }

    /// `hawser volume create NAME FLAG FROM --replicas N`: what it said, and whether the
    /// volume exists now (a create that failed may have made it all the same).
    fn create(&self, name: &str, flag: &str, from: &str, replicas: u32) -> (String, bool) {
        let r = replicas.to_string();
        let said = self.cli(&["volume", "create", name, flag, from, "--replicas", &r]);
        let exists = self.w.api.get::<Volume>(&format!("/v1/volumes/{name}"));
        (said_short(said), exists.is_ok())
    }

    fn restore(&mut self, of: usize, replicas: u32) -> String {
        let Some((backup, state)) = self.ended(of) else {
            return "no backup yet".into();
        };
        let name = format!("s{}-r{}", self.n, self.restores.len() + 1);
        let from = format!("offsite/{backup}");
        let (said, exists) = self.create(&name, "--from-backup", &from, replicas);
        if exists {
            self.restores.push((name.clone(), backup.clone()));
        }
        format!("{name} from {backup} ({state}): {said}")
    }

    /// A standby of the source, once its first backup ended.
    fn make_standby(&mut self, replicas: u32) -> String {
        let first = self.ended(0).map(|(_, s)| s).unwrap_or_default();
        let name = format!("s{}-dr", self.n);
        let of = format!("offsite/{}", self.src);
        let (said, exists) = self.create(&name, "--standby-of", &of, replicas);
        if exists {
            self.standby = Some(name.clone());
        }
        format!("{name} (first backup {first}): {said}")
    }

    fn delete(&mut self, of: usize) -> String {
        let Some((backup, state)) = self.ended(of) else {
            return "no backup yet".into();
        };
        let said = self.cli(&["backup", "delete", &backup]);
        format!("{backup} ({state}): {}", said_short(said))
    }

    fn kill(&mut self, agent: usize) -> String {
        let mut what = String::new();
        if self.attached.as_ref().is_some_and(|(a, _)| *a == agent) {
            self.w.c.cli_ok(&["volume", "detach", &self.src]);
            self.attached = None;
            what = "source detached, then ".into();
        }
        self.w.c.kill_agent(AGENTS[agent]);
        self.w.down = Some(agent);
        what + "killed"
    }
}

/// "ok" or the refusal, for the log.
fn said_short(said: Result<String, String>) -> String {
    match said {
        Ok(_) => "ok".into(),
        Err(e) => format!("refused: {e}"),
    }
}

/// The whole answer, or the refusal, for the log.
fn said(said: Result<String, String>) -> String {
    match said {
        Ok(out) => out.split_whitespace().collect::<Vec<_>>().join(" "),
        Err(e) => format!("refused: {e}"),
    }
}

fn now_ms() -> u64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("a clock after 1970");
    u64::try_from(since.as_millis()).expect("ms fit u64")
}

impl Seed<'_> {
    /// Waits until the seed's backups have ended, then until its restores are detached and
    /// its standby holds the newest backup it can, with nobody's help; panics after
    /// [`SETTLE`] naming what has not.
    fn settle(&self) -> Duration {
        let t = Instant::now();
        let mut left = Vec::new();
        let src = format!("volume={}", self.src);
        let ended = within(SETTLE, || {
            left = match self.w.api.get::<Vec<Backup>>(&format!("/v1/backups?{src}")) {
                Ok(all) => all
                    .into_iter()
                    .filter(|b| b.state == BackupState::Running)
                    .map(|b| format!("backup {} running", b.name))
                    .collect(),
                Err(e) => vec![e],
            };
            left.is_empty()
        });
        assert!(ended, "not ended within {SETTLE:?}: {left:?}");
        // From here the set of manifests only shrinks: a standby that read the target after
        // now has seen its newest backup.
        let t0 = now_ms();
        let settled = within(SETTLE.saturating_sub(t.elapsed()), || {
            left = self.unsettled(t0);
            left.is_empty()
        });
        assert!(
            settled,
            "not settled within {SETTLE:?} (no operator action): {left:?}"
        );
        t.elapsed()
    }

    /// What is not settled yet, one line each.
    fn unsettled(&self, t0: u64) -> Vec<String> {
        let mut left = Vec::new();
        for (name, backup) in &self.restores {
            match self.w.api.get::<Volume>(&format!("/v1/volumes/{name}")) {
                Ok(v) if v.restoring.is_none() && v.state == VolumeState::Detached => {}
                Ok(v) => left.push(format!(
                    "{name} from {backup}: {:?}, restoring {:?}",
                    v.state, v.restoring
                )),
                Err(e) => left.push(e),
            }
        }
        // A backup drops its snapshot when it ends; one a node down missed is discarded
        // again once every node answers (`reconcile.rs`, every 5 s).
        match self
            .w
            .api
            .get::<Vec<Snapshot>>(&format!("/v1/snapshots?volume={}", self.src))
        {
            Ok(snaps) => left.extend(
                snaps
                    .iter()
                    .map(|s| format!("snapshot {} of {} {:?}", s.name, self.src, s.state)),
            ),
            Err(e) => left.push(e),
        }
        let Some(name) = &self.standby else {
            return left;
        };
        match self.w.api.get::<Volume>(&format!("/v1/volumes/{name}")) {
            Ok(v) => {
                let s = v.standby.expect("still a standby (none is activated)");
                let idle = s.applying.is_none() && s.error.is_none();
                let looked = s.checked_ms.is_some_and(|c| c >= t0);
                // Parts of a vanished backup, and a backup to apply over them.
                let can_move_on = s.mixed.is_some() && self.has_manifest_of_source();
                if !idle || !looked || can_move_on {
                    left.push(format!("{name}: {s:?}"));
                }
            }
            Err(e) => left.push(e),
        }
        left
    }

    fn has_manifest_of_source(&self) -> bool {
        self.w
            .manifests()
            .iter()
            .any(|m| hawser_backup::names::order_of(m, &self.src).is_some())
    }
}

/// What a seed compared.
#[derive(Default)]
struct Compared {
    backups: usize,
    replicas: usize,
}

impl Seed<'_> {
    /// Every manifest on the target, every restored volume and the standby, against what the
    /// test kept.
    fn check(&self) -> Compared {
        let mut n = Compared::default();
        let manifests = self.w.manifests();
        for b in self.w.backups("target=offsite") {
            assert!(
                b.state != BackupState::Ready || manifests.contains(&b.name),
                "backup {} is listed ready, but its manifest is not on the target",
                b.name
            );
        }
        let file = self.w.dir.path().join("restored");
        for m in &manifests {
            let made = self.w.known.get(m).unwrap_or_else(|| {
                panic!("manifest {m} on the target: not a backup this test made")
            });
            hawser_e2e::backups::restore_to_file(&self.w.target, m, &file, SIZE);
            assert_eq!(
                sha256_of(&file, SIZE),
                made.sha,
                "backup {m} (made by run {}) restores to other bytes than its volume held \
                 when it was taken",
                made.run
            );
            n.backups += 1;
        }
        for (name, backup) in &self.restores {
            n.replicas += self.compare_replicas(name, backup, "restored from");
        }
        if let Some(name) = &self.standby {
            let v: Volume = self.w.get(&format!("/v1/volumes/{name}"));
            let s = v.standby.expect("a standby");
            if let (Some(a), None) = (&s.applied, &s.mixed) {
                n.replicas += self.compare_replicas(name, &a.backup, "a standby that applied");
            }
        }
        // Last, once the data is compared: a backup drops the snapshot it took when it ends,
        // or when it fails to start.
        let left: Vec<Snapshot> = self.w.get(&format!("/v1/snapshots?volume={}", self.src));
        assert!(
            left.is_empty(),
            "{} keeps snapshots its backups took, with no backup running: {left:?}",
            self.src
        );
        n
    }

    /// Each replica of `volume` holds `backup`'s bytes; returns how many were compared.
    fn compare_replicas(&self, volume: &str, backup: &str, how: &str) -> usize {
        let want = &self
            .w
            .known
            .get(backup)
            .expect("a backup the test made")
            .sha;
        let v: Volume = self.w.get(&format!("/v1/volumes/{volume}"));
        for r in &v.replicas {
            let got = sha256_of(&self.w.c.replica_path(&r.id), SIZE);
            assert_eq!(
                &got, want,
                "{volume}, {how} {backup}: its replica {} on {} holds other bytes",
                r.id, r.node
            );
        }
        v.replicas.len()
    }

    /// Deletes the seed's volumes, and the backups of the seeds before it (checked twice now).
    fn clean_up(&mut self) {
        if self.attached.take().is_some() {
            self.w.c.cli_ok(&["volume", "detach", &self.src]);
        }
        let names = self.restores.iter().map(|(v, _)| v.clone());
        let names: Vec<String> = names.chain(self.standby.clone()).collect();
        for v in names.iter().chain([&self.src]) {
            self.w.c.cli_ok(&["volume", "delete", v]);
        }
        for b in self.w.backups("target=offsite") {
            let made = self.w.known.get(&b.name).expect("a backup the test made");
            if made.run < self.run {
                self.w.c.cli_ok(&["backup", "delete", &b.name]);
            }
        }
    }
}

/// Runs seed `n` (the `run`-th of this test) to its end and its checks.
fn run_seed(w: &mut World, run: usize, n: u64, ops: &[Op]) -> String {
    let mut s = Seed::new(w, n, run);
    for (i, op) in ops.iter().enumerate() {
        let t = Instant::now();
        let did = s.apply(*op);
        let ms = t.elapsed().as_millis();
        let line = format!("{i:>2} {op}: {did} ({ms} ms)");
        if std::env::var_os("HAWSER_INTERLEAVE_VERBOSE").is_some() {
            eprintln!("  {line}");
        }
        s.w.log.push(line);
    }
    let settled = s.settle();
    let n = s.check();
    s.clean_up();
    format!(
        "settled in {:.1} s; {} backups and {} replicas compared",
        settled.as_secs_f64(),
        n.backups,
        n.replicas
    )
}

/// What to tell whoever replays a failed seed.
fn report(w: &World, n: u64, ops: &[Op]) {
    eprintln!(
        "backup_seeds: seed {n} FAILED. Replay it with\n  HAWSER_INTERLEAVE_SEEDS={n} \
         HAWSER_BIN=... cargo test --release -p hawser-e2e --test backup_seeds -- \
         --nocapture\nits ops: {}\nwhat they did:",
        listed(ops)
    );
    for l in &w.log {
        eprintln!("  {l}");
    }
    let events = w.c.cli(&["events"]);
    let mine = format!("s{n}-");
    eprintln!("its events:");
    for l in String::from_utf8_lossy(&events.stdout).lines() {
        if l.contains(&mine) || l.contains("Prune") {
            eprintln!("  {l}");
        }
    }
}

#[test]
fn seeded_interleavings_with_kills_keep_every_backup_restore_and_standby_exact() {
    let seeds = seeds();
    // Every failing seed of a long run, rather than the first one only.
    let keep_going = std::env::var_os("HAWSER_INTERLEAVE_KEEP_GOING").is_some();
    let mut w = World::start();
    let started = Instant::now();
    let mut failed = Vec::new();
    for (run, &n) in seeds.iter().enumerate() {
        let ops = ops_of(n);
        eprintln!("seed {n}: {}", listed(&ops));
        w.log.clear();
        let t = Instant::now();
        match catch_unwind(AssertUnwindSafe(|| run_seed(&mut w, run, n, &ops))) {
            Ok(how) => eprintln!(
                "seed {n}: passed in {:.1} s, {how}",
                t.elapsed().as_secs_f64()
            ),
            Err(panic) if keep_going => {
                report(&w, n, &ops);
                failed.push((n, panic_text(&*panic)));
                if catch_unwind(AssertUnwindSafe(|| w.forget(n))).is_err() {
                    panic!("the cluster did not recover after seed {n}; failed: {failed:#?}");
                }
            }
            Err(panic) => {
                report(&w, n, &ops);
                resume_unwind(panic);
            }
        }
    }
    let secs = started.elapsed().as_secs_f64();
    assert!(
        failed.is_empty(),
        "{} of {} seeds failed in {secs:.0} s: {failed:#?}",
        failed.len(),
        seeds.len()
    );
    eprintln!("backup_seeds: {} seeds passed in {secs:.0} s", seeds.len());
    drop(w);
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default()
}

impl World {
    /// After a failed seed `n` (with `HAWSER_INTERLEAVE_KEEP_GOING`): its agent up again and
    /// its volumes deleted as an operator would, so the next seeds start as they should.
    fn forget(&mut self, n: u64) {
        // A controller that cannot start again ends the run: no later seed could pass.
        self.c.wait_leader(Duration::from_secs(30));
        self.revive();
        for v in ["v", "r1", "r2", "dr"].map(|x| format!("s{n}-{x}")) {
            let _ = self.c.cli(&["volume", "detach", &v]);
            let _ = self.c.cli(&["volume", "delete", &v, "--with-snapshots"]);
        }
    }
}

/// The seeds to run: `HAWSER_INTERLEAVE_SEEDS` (a comma-separated list), else
/// `HAWSER_INTERLEAVE_COUNT` (50) seeds from `HAWSER_INTERLEAVE_SEED_FROM` (1).
fn seeds() -> Vec<u64> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let num = |name: &str, v: &str| -> u64 {
        v.trim()
            .parse()
            .unwrap_or_else(|e| panic!("{name}={v:?}: not a number: {e}"))
    };
    if let Some(list) = var("HAWSER_INTERLEAVE_SEEDS") {
        let each = list.split(',').map(|s| num("HAWSER_INTERLEAVE_SEEDS", s));
        return each.collect();
    }
    let from = var("HAWSER_INTERLEAVE_SEED_FROM").map_or(1, |v| num("SEED_FROM", &v));
    let count = var("HAWSER_INTERLEAVE_COUNT").map_or(50, |v| num("COUNT", &v));
    (from..from + count).collect()
}
