//! Backups and restores that meet other jobs (issue 61): a prune while a restore reads the
//! backup it just deleted, and a restore whose controller restarts or loses its leadership
//! half-way. Real processes throughout: the hawser binary, SeaweedFS as the S3 target.

use std::time::Duration;

use hawser_api::backup::{Backup, BackupState, PruneReport};
use hawser_api::controller::Volume;
use hawser_backup::Target;
use hawser_e2e::cluster::{Cluster, ClusterOptions};
use hawser_e2e::compare::sha256_of;
use hawser_e2e::run::qemu_io;
use hawser_e2e::{S3Server, TempDir};

const MIB: u64 = 1 << 20;

/// A cluster's S3 target `offsite`, and the same target opened from the test.
struct Offsite {
    dir: TempDir,
    s3: S3Server,
    target: Target,
    rt: tokio::runtime::Runtime,
}

impl Offsite {
    /// A new S3 server under a directory named `name`, added to `c` as `offsite`.
    fn add_to(c: &Cluster, name: &str) -> Offsite {
        let dir = TempDir::new(name);
        let s3 = S3Server::start(dir.path(), "backups");
        s3.add_to(c, "offsite", "cluster-1");
        let target = s3.target("offsite", "cluster-1", 120);
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        Offsite {
            dir,
            s3,
            target,
            rt,
        }
    }

    /// The objects under `under` on the target.
    fn list(&self, under: &str) -> Vec<String> {
        self.rt
            .block_on(self.target.list(under))
            .expect("list the target")
    }

    /// How many replicas' jobs hold the target now: the readers other than the controller's
    /// holds of its restores (`restore-<uid>-<ms>`, `restore_holds.rs`).
    fn job_readers(&self) -> usize {
        self.list("locks")
            .iter()
            .filter(|l| l.starts_with("locks/read-") && !l.starts_with("locks/read-restore-"))
            .count()
    }

    /// How many readers hold the target now (`hawser_backup::readers`).
    fn readers(&self) -> usize {
        self.list("locks")
            .iter()
            .filter(|l| l.starts_with("locks/read-"))
            .count()
    }
}

/// 4 MiB/s per job: a 64 MiB restore reads for ~16 s on each replica's node; no prune
/// grace, so only the reader locks keep a deleted backup's blocks.
fn slow_restores() -> Vec<String> {
    ["--backup-rate", "4194304", "--backup-prune-grace-secs", "0"]
        .map(String::from)
        .to_vec()
}

/// `hawser backup create VOLUME --target offsite --wait`, ready.
fn backup(c: &Cluster, volume: &str) -> Backup {
    let out = c.cli_ok(&[
        "backup", "create", volume, "--target", "offsite", "--wait", "-o", "json",
    ]);
    let b: Backup = serde_json::from_str(&out).expect("backup JSON");
    assert_eq!(b.state, BackupState::Ready, "{b:?}");
    b
}

/// Volume `src` (64 MiB of 64 different blocks, two replicas) and a ready backup of it.
fn source_backup(c: &Cluster) -> (Backup, String) {
    let uri = c.attached_volume("src", "64MiB", 2, "n1");
    let writes: Vec<String> = (0..64)
        .map(|i| format!("write -P {} {i}M 1M", i + 1))
        .collect();
    let mut cmds: Vec<&str> = writes.iter().map(String::as_str).collect();
    cmds.push("flush");
    qemu_io(&uri, &cmds);
    let out = c.cli_ok(&[
        "backup", "create", "src", "--target", "offsite", "--wait", "-o", "json",
    ]);
    let b: Backup = serde_json::from_str(&out).expect("backup JSON");
    assert_eq!(b.state, BackupState::Ready, "{b:?}");
    let sum = sha256_of(&c.replica_path(&c.replica_on("src", "n1").id), 64 * MIB);
    (b, sum)
}

/// `hawser volume create NAME --from-backup offsite/BACKUP --replicas 2`.
fn restore(c: &Cluster, name: &str, b: &Backup) {
    let from = format!("offsite/{}", b.name);
    c.cli_ok(&[
        "volume",
        "create",
        name,
        "--from-backup",
        &from,
        "--replicas",
        "2",
    ]);
}

/// Waits until `volume` is detached and no longer restoring, then checks every replica. A
/// failed read counts as not yet: around a change of leader the API answers "no leader".
fn restored(c: &Cluster, volume: &str, want: &str) {
    let mut seen: Option<Volume> = None;
    hawser_e2e::wait_until("the restore", Duration::from_secs(180), || {
        let out = c.cli(&["volume", "show", volume, "-o", "json"]);
        seen = out
            .status
            .success()
            .then(|| serde_json::from_slice(&out.stdout).ok())
            .flatten();
        seen.as_ref().is_some_and(|v| v.restoring.is_none())
    });
    let v = seen.expect("the volume");
    assert_eq!(
        v.state,
        hawser_api::controller::VolumeState::Detached,
        "{v:?}"
    );
    for replica in v.replicas {
        assert_eq!(
            sha256_of(&c.replica_path(&replica.id), 64 * MIB),
            want,
            "{replica:?}"
        );
    }
}

/// `hawser backup target prune offsite`, again while the leader's own prune holds the target.
fn prune_now(c: &Cluster) -> PruneReport {
    let mut report = None;
    hawser_e2e::wait_until("a prune of the target", Duration::from_secs(30), || {
        let out = c.cli(&["backup", "target", "prune", "offsite", "-o", "json"]);
        report = out
            .status
            .success()
            .then(|| serde_json::from_slice(&out.stdout).expect("JSON"));
        report.is_some()
    });
    report.expect("a prune report")
}

/// Issue 61.a: a PVC made from a backup, the backup deleted at once and the target pruned
/// with no grace while the replicas' agents still read it. Before reader locks the prune
/// deleted the blocks only that backup named: the restore failed with a missing block and
/// the copy and the backup were both gone.
#[test]
fn a_prune_during_a_restore_keeps_the_deleted_backups_blocks_until_the_restore_ends() {
    let opts = ClusterOptions {
        controller_args: slow_restores(),
        ..Default::default()
    };
    let c = Cluster::start_with("prune-restore", 2, opts);
    let t = Offsite::add_to(&c, "prune-restore-s3");
    let (b, want) = source_backup(&c);
    assert_eq!(t.list("blocks").len(), 64);

    restore(&c, "copy", &b);
    hawser_e2e::wait_until(
        "the restore's reader lock and both replicas'",
        Duration::from_secs(60),
        || t.readers() == 3,
    );
    // The backup deleted (the leader prunes after it on its own) and a prune forced.
    c.cli_ok(&["backup", "delete", &b.name]);
    // A reader held the deleted backup when the target was pruned: the restore (16 s) was
    // still reading.
    let r = prune_now(&c);
    assert_eq!(
        (r.backups, r.held_backups, r.deleted_blocks),
        (0, 1, 0),
        "{r:?}"
    );
    assert_eq!(
        t.list("blocks").len(),
        64,
        "a prune deleted blocks a restore reads"
    );

    restored(&c, "copy", &want);
    hawser_e2e::wait_until("the readers to let go", Duration::from_secs(10), || {
        t.readers() == 0
    });
    // Nobody reads the backup now: the next prune (the leader's, if it was still waiting for
    // its turn, or this one) takes its manifest and blocks.
    let r = prune_now(&c);
    assert_eq!(r.held_backups, 0, "{r:?}");
    assert!(
        t.list("blocks").is_empty() && t.list("retired").is_empty(),
        "{r:?}"
    );
}

/// Issue 61.b: the only controller killed (-9) and started again while the replicas' nodes
/// restore. The follower of the restore was a task of the dead process: the volume stayed
/// `restoring` for good, with every replica written.
#[test]
fn a_restore_reaches_detached_after_its_controller_restarts_mid_restore() {
    let opts = ClusterOptions {
        controller_args: slow_restores(),
        ..Default::default()
    };
    let mut c = Cluster::start_with("restore-restart", 2, opts);
    let t = Offsite::add_to(&c, "restore-restart-s3");
    let (b, want) = source_backup(&c);
    restore(&c, "copy", &b);
    hawser_e2e::wait_until("the restore's readers", Duration::from_secs(60), || {
        t.readers() == 3
    });
    // Both nodes still read (their locks are live), so the dead controller cannot have
    // seen the restore end; the one started again may, within its first second.
    c.restart_controller(0);
    c.wait_leader(Duration::from_secs(30));
    restored(&c, "copy", &want);
    let events = c.cli_ok(&["events"]);
    assert_eq!(events.matches("RestoreDone").count(), 1, "{events}");
}

/// Issue 61 (found by `backup_seeds`): a restore whose replicas' jobs all end while its
/// controller is down, its backup deleted before and the target pruned meanwhile (with no
/// grace, as another cluster sharing the target may), then both agents killed, so that the
/// finished jobs, kept in their memory only, are lost and run again. Before the restore
/// held its backup itself (`restore_holds.rs`), the last job's end let the prune take the
/// backup: the jobs run again found nothing, and the volume stayed `restoring` for good.
#[test]
fn a_restore_whose_jobs_ended_unseen_outlives_a_prune_and_its_agents_restarts() {
    let opts = ClusterOptions {
        controller_args: slow_restores(),
        ..Default::default()
    };
    let mut c = Cluster::start_with("restore-unseen", 2, opts);
    let t = Offsite::add_to(&c, "restore-unseen-s3");
    let (b, want) = source_backup(&c);
    restore(&c, "copy", &b);
    hawser_e2e::wait_until("both replicas' jobs", Duration::from_secs(60), || {
        t.job_readers() == 2
    });
    assert_eq!(t.readers(), 3, "the restore holds its backup too");
    c.cli_ok(&["backup", "delete", &b.name]);
    // The leader prunes after a delete on its own; killed mid-prune, it would leave its prune
    // lock, which keeps the test's prune out for the stale time.
    hawser_e2e::wait_until("the leader's prune", Duration::from_secs(30), || {
        c.cli_ok(&["events"]).contains("BackupTargetPruned")
    });
    c.kill_controller(0);
    hawser_e2e::wait_until(
        "both replicas' jobs to end",
        Duration::from_secs(120),
        || t.job_readers() == 0,
    );
    let r =
        t.rt.block_on(hawser_backup::prune::prune(&t.target, "test", None, 0))
            .expect("a prune of the target");
    assert_eq!((r.held_backups, r.deleted_blocks), (1, 0), "{r:?}");
    for node in ["n1", "n2"] {
        c.kill_agent(node);
        c.relaunch_agent(node, &hawser_e2e::cluster::hawser_bin(), false);
    }
    c.restart_controller(0);
    c.wait_leader(Duration::from_secs(30));
    restored(&c, "copy", &want);
    hawser_e2e::wait_until("the readers to let go", Duration::from_secs(10), || {
        t.readers() == 0
    });
}

/// Found by `backup_seeds`: the only controller killed (-9) mid-prune left its prune lock on
/// the target, and every backup waited it out for the stale time (10 min). Restarted, it
/// deletes the locks of its own cluster that it does not hold (`prune_locks.rs`) and keeps
/// those of another cluster; a backup then runs at once.
#[test]
fn a_prune_lock_left_by_a_killed_controller_is_cleared_at_its_restart() {
    let mut c = Cluster::start_with(
        "prune-left",
        1,
        ClusterOptions {
            controller_args: ["--backup-prune-grace-secs", "0"]
                .map(String::from)
                .to_vec(),
            ..Default::default()
        },
    );
    let t = Offsite::add_to(&c, "prune-left-s3");
    // Blocks no manifest names, enough for the prune to take a while.
    t.rt.block_on(async {
        let mut puts = tokio::task::JoinSet::new();
        for i in 0..3000u32 {
            let hash = hawser_e2e::compare::sha256_hex(&i.to_le_bytes());
            let object = format!("blocks/{}/{hash}.zst", &hash[..2]);
            let target = t.target.clone();
            puts.spawn(async move { target.put(&object, b"x".to_vec().into()).await });
            if puts.len() >= 32 {
                puts.join_next()
                    .await
                    .expect("a put")
                    .expect("join")
                    .expect("put a block");
            }
        }
        while let Some(r) = puts.join_next().await {
            r.expect("join").expect("put a block");
        }
    });
    let mut running = c
        .cli_command(&["backup", "target", "prune", "offsite"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start the prune request");
    hawser_e2e::wait_until("the prune's lock", Duration::from_secs(30), || {
        t.list("locks")
            .iter()
            .any(|l| l.starts_with("locks/prune-"))
    });
    c.kill_controller(0);
    let prune = running.wait().expect("the prune request");
    let left: Vec<String> = t.list("locks");
    assert!(
        !prune.success() && left.len() == 1 && t.list("blocks").len() > 64,
        "the controller was to die mid-prune: {left:?}, {} blocks left",
        t.list("blocks").len()
    );
    // Another cluster's prune, live on the same target.
    let foreign = hawser_backup::locks::LockBody {
        kind: hawser_backup::locks::LockKind::Prune,
        holder: "another-cluster".into(),
        cluster: Some("another".into()),
        host: None,
        started_ms: 0,
        reads: Vec::new(),
    };
    let foreign_object = "locks/prune-another-cluster.json";
    t.rt.block_on(t.target.put(
        foreign_object,
        serde_json::to_vec(&foreign).expect("JSON").into(),
    ))
    .expect("put the other cluster's lock");

    c.restart_controller(0);
    c.wait_leader(Duration::from_secs(30));
    hawser_e2e::wait_until(
        "the dead run's prune lock to go",
        Duration::from_secs(20),
        || t.list("locks") == [foreign_object],
    );
    t.rt.block_on(t.target.delete(foreign_object))
        .expect("delete the other cluster's lock");
    c.attached_volume("v", "4MiB", 1, "n1");
    backup(&c, "v");
}

/// Issue 61.b: two controllers on etcd, and the leader killed while the replicas' nodes
/// restore: the other one leads and finishes the restore.
#[test]
fn a_restore_reaches_detached_after_a_leader_change_mid_restore() {
    let opts = ClusterOptions {
        etcd_controllers: 2,
        controller_args: slow_restores(),
        ..Default::default()
    };
    let mut c = Cluster::start_with("restore-leader", 2, opts);
    let t = Offsite::add_to(&c, "restore-leader-s3");
    // A target's S3 key lives on the controller that was given it; the others get a copy,
    // as its error message tells an operator to do.
    let keys = |name: &str| c.dir.path().join(name).join("backup-targets");
    let leader = &c.controllers[c.wait_leader(Duration::from_secs(10))].name;
    let other = if leader == "controller-1" {
        "controller-2"
    } else {
        "controller-1"
    };
    std::fs::create_dir_all(keys(other)).expect("mkdir");
    let (from, to) = (
        keys(leader).join("offsite.credentials"),
        keys(other).join("offsite.credentials"),
    );
    std::fs::copy(&from, &to).expect("copy the target's key to the other controller");
    let (b, want) = source_backup(&c);
    restore(&c, "copy", &b);
    hawser_e2e::wait_until("the restore's readers", Duration::from_secs(60), || {
        t.readers() == 3
    });
    let old = c.wait_leader(Duration::from_secs(10));
    c.kill_controller(old);
    // As above: the old leader died while both nodes still read.
    let new = c.wait_leader(Duration::from_secs(60));
    assert_ne!(old, new);
    restored(&c, "copy", &want);
}

/// Issue 61.c: a standby whose next backup vanishes half-applied. One of site B's nodes is
/// down while B2 applies (the other applies it), B2 is deleted and pruned at site A, and
/// the node comes back: its job can never finish. Before, the standby retried it for good
/// and `activate --as-is` was refused. Now it applies the newest backup, B3, comparing every
/// block: B3 puts back a block B2 had changed, so an apply over B1 as its base would leave
/// B2's bytes on the node that applied B2.
#[test]
fn a_standby_moves_past_a_backup_that_vanished_while_it_applied() {
    let grace = ClusterOptions {
        controller_args: ["--backup-prune-grace-secs", "0"]
            .map(String::from)
            .to_vec(),
        ..Default::default()
    };
    let a = Cluster::start_with("vanished-a", 1, grace);
    let t = Offsite::add_to(&a, "vanished-s3");
    let uri = a.attached_volume("db", "32MiB", 1, "n1");
    qemu_io(
        &uri,
        &["write -P 0x11 0 1M", "write -P 0x12 1M 1M", "flush"],
    );
    let b1 = backup(&a, "db");

    let poll = ClusterOptions {
        controller_args: ["--standby-poll-secs", "1"].map(String::from).to_vec(),
        ..Default::default()
    };
    let mut b = Cluster::start_with("vanished-b", 2, poll);
    t.s3.add_to(&b, "offsite", "cluster-1");
    b.cli_ok(&[
        "volume",
        "create",
        "dr",
        "--standby-of",
        "offsite/db",
        "--replicas",
        "2",
    ]);
    let holds = |b: &Cluster, backup: &str| {
        let s = b.volume("dr").standby.expect("a standby");
        s.applied.is_some_and(|x| x.backup == backup)
    };
    hawser_e2e::wait_until("dr to hold B1", Duration::from_secs(90), || {
        holds(&b, &b1.name)
    });

    // B2 while n2 is down: n1 applies it, n2 cannot.
    b.kill_agent("n2");
    qemu_io(
        &uri,
        &["write -P 0x22 0 1M", "write -P 0x23 2M 1M", "flush"],
    );
    let b2 = backup(&a, "db");
    hawser_e2e::wait_until("dr to apply B2 on n1 only", Duration::from_secs(90), || {
        let s = b.volume("dr").standby.expect("a standby");
        s.applying.as_deref() == Some(b2.name.as_str()) && s.error.is_some_and(|e| e.contains("n2"))
    });
    // Once n1's job has let B2 go, site A deletes it and prunes its blocks for good.
    a.cli_ok(&["backup", "delete", &b2.name]);
    hawser_e2e::wait_until("B2 pruned at site A", Duration::from_secs(90), || {
        prune_now(&a);
        t.list("retired").is_empty()
    });
    // B3 puts block 0 back as B1 had it, and keeps B2's other change.
    qemu_io(&uri, &["write -P 0x11 0 1M", "flush"]);
    let b3 = backup(&a, "db");
    b.restart_agent_from("n2", &hawser_e2e::cluster::hawser_bin(), false);
    hawser_e2e::wait_until("dr to hold B3", Duration::from_secs(120), || {
        holds(&b, &b3.name)
    });
    let s = b.volume("dr").standby.expect("a standby");
    assert!(s.mixed.is_none() && s.applying.is_none(), "{s:?}");
    assert!(b.cli_ok(&["events"]).contains("StandbyBackupVanished"));
    let img = t.dir.path().join("b3");
    hawser_e2e::backups::restore_to_file(&t.target, &b3.name, &img, 32 * MIB);
    let want = sha256_of(&img, 32 * MIB);
    for r in b.volume("dr").replicas {
        assert_eq!(
            sha256_of(&b.replica_path(&r.id), 32 * MIB),
            want,
            "replica on {}",
            r.node
        );
    }
    // Between jobs, the DR copy can be taken as it is.
    b.cli_ok(&["volume", "activate", "dr", "--as-is"]);
    b.cli_ok(&["volume", "attach", "dr", "--node", "n2"]);
    let io = qemu_io(
        &b.volume("dr").nbd_unix_uri.expect("an NBD URI"),
        &[
            "read -P 0x11 0 1M",
            "read -P 0x12 1M 1M",
            "read -P 0x23 2M 1M",
        ],
    );
    assert!(!io.contains("verification failed"), "{io}");
}
