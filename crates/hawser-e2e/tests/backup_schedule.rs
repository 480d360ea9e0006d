//! Backups on a schedule, retention and pruning (issue 43 item 4), through the binary and a
//! real SeaweedFS: a schedule makes backups, keeps its newest two, deletes the older ones
//! from the target, and a prune deletes the blocks only they named, while the blocks of kept
//! backups (and of a backup made by hand, which retention never deletes) stay and restore.
//! A prune is refused while a backup runs on the target, and a running backup cannot be
//! deleted.

use std::collections::BTreeSet;
use std::time::Duration;

use hawser_api::backup::{Backup, BackupState};
use hawser_backup::Target;
use hawser_e2e::cluster::{Cluster, ClusterOptions};
use hawser_e2e::run::qemu_io;
use hawser_e2e::{S3Server, TempDir};

const MIB: u64 = 1 << 20;
/// [`MIB`], to index with.
const MIB_LEN: usize = 1 << 20;
const SIZE: u64 = 16 * MIB;

fn backups(c: &Cluster) -> Vec<Backup> {
    serde_json::from_str(&c.cli_ok(&["backup", "list", "-o", "json"])).expect("backup list")
}

fn now_ms() -> u64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970");
    u64::try_from(d.as_millis()).expect("ms fit")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().expect("runtime")
}

/// The manifests on the target, by backup name.
fn on_target(t: &Target) -> BTreeSet<String> {
    runtime()
        .block_on(hawser_backup::list_backups(t))
        .expect("list backups")
        .into_iter()
        .collect()
}

/// Whether the block holding 1 MiB of `byte` is on the target.
fn has_block(t: &Target, byte: u8) -> bool {
    let hash = hawser_backup::block::hash(&vec![byte; MIB_LEN]);
    runtime()
        .block_on(t.size(&hawser_backup::names::block(&hash)))
        .expect("look up a block")
        .is_some()
}

#[test]
fn schedules_keep_their_newest_backups_and_prune_the_rest() {
    let dir = TempDir::new("schedule-s3");
    let s3 = S3Server::start(dir.path(), "backups");
    let target = s3.target("offsite", "sched", 120);
    // Backups read at 2 MiB/s, so one runs long enough to be seen running; blocks are
    // pruned as soon as no backup names them (every agent here takes target locks).
    let c = Cluster::start_with(
        "schedule",
        1,
        ClusterOptions {
            controller_args: ["--backup-rate", "2097152", "--backup-prune-grace-secs", "0"]
                .map(String::from)
                .to_vec(),
            ..Default::default()
        },
    );
    s3.add_to(&c, "offsite", "sched");
    let uri = c.attached_volume("db", "16MiB", 1, "n1");
    qemu_io(&uri, &["write -P 0x11 0 4M", "flush"]);

    // A backup by hand, seen running: a prune of its target is refused, and so is deleting it.
    let out = c.cli_ok(&[
        "backup", "create", "db", "--target", "offsite", "-o", "json",
    ]);
    let manual: Backup = serde_json::from_str(&out).expect("backup JSON");
    hawser_e2e::wait_until("the backup to read", Duration::from_secs(30), || {
        let b: Backup =
            serde_json::from_str(&c.cli_ok(&["backup", "show", &manual.name, "-o", "json"]))
                .expect("backup JSON");
        assert_eq!(b.state, BackupState::Running, "{b:?}");
        b.progress.is_some_and(|p| p.done_bytes > 0)
    });
    c.cli_fails(
        &["backup", "target", "prune", "offsite"],
        &format!("backup {} (lock written", manual.name),
    );
    c.cli_fails(&["backup", "delete", &manual.name], "is running");
    hawser_e2e::wait_until("the backup to be ready", Duration::from_secs(60), || {
        backups(&c)
            .iter()
            .any(|b| b.name == manual.name && b.state == BackupState::Ready)
    });
    let out = c.cli_ok(&["backup", "target", "prune", "offsite"]);
    assert!(out.contains("pruned: 0 blocks deleted"), "{out}");

    // Bad input says what is wrong.
    let schedule = |volume: &str, target: &str, cron: &str, retain: &str| {
        vec![
            "backup".to_owned(),
            "schedule".into(),
            volume.into(),
            "--target".into(),
            target.into(),
            "--cron".into(),
            cron.into(),
            "--retain".into(),
            retain.into(),
        ]
    };
    let fails = |args: Vec<String>, want: &str| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        c.cli_fails(&args, want);
    };
    fails(schedule("db", "offsite", "junk", "2"), "cron \"junk\"");
    fails(schedule("db", "offsite", "0 * * * *", "0"), "keep from 1");
    fails(schedule("db", "nowhere", "0 * * * *", "2"), "nowhere");
    fails(schedule("nosuch", "offsite", "0 * * * *", "2"), "nosuch");
    c.cli_fails(
        &["backup", "unschedule", "db", "--target", "offsite"],
        "not found",
    );
    c.cli_fails(&["backup", "delete", "db-20260101-000000"], "not found");
    c.cli_fails(&["backup", "delete", "No_Such"], "backup");

    // Every three seconds, keeping two. Block 1 changes before each run, so each backup
    // names a block of its own there.
    let args = schedule("db", "offsite", "*/3 * * * * *", "2");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = c.cli_ok(&args);
    assert!(out.contains("keeping 2; next run"), "{out}");
    let mut made: Vec<String> = Vec::new();
    for i in 0..4u8 {
        qemu_io(&uri, &[&format!("write -P {:#x} 4M 1M", 0x20 + i), "flush"]);
        let wrote = now_ms();
        hawser_e2e::wait_until("a scheduled backup", Duration::from_secs(60), || {
            let v = c.volume("db");
            let s = v.backup_schedules.first().expect("the schedule").clone();
            let Some(last) = s.last_backup else {
                return false;
            };
            // Ready, and started after the write above.
            backups(&c)
                .iter()
                .any(|b| b.name == last && b.state == BackupState::Ready && b.created_ms > wrote)
                .then(|| made.push(last))
                .is_some()
        });
    }
    let listed = c.cli_ok(&["backup", "schedules", "--volume", "db"]);
    assert!(
        listed.contains("*/3 * * * * *") && listed.contains(made.last().expect("made")),
        "{listed}"
    );

    // The schedule kept its newest two (at most three, while the newest awaits its pass);
    // the first two are gone from the store and the target, and so, after the prune, are
    // the blocks only they named. The backup made by hand stays.
    hawser_e2e::wait_until("retention and a prune", Duration::from_secs(60), || {
        let names: BTreeSet<String> = backups(&c)
            .into_iter()
            .filter(|b| b.state == BackupState::Ready)
            .map(|b| b.name)
            .collect();
        !names.contains(&made[0])
            && !names.contains(&made[1])
            && !has_block(&target, 0x20)
            && !has_block(&target, 0x21)
    });
    c.cli_ok(&["backup", "unschedule", "db", "--target", "offsite"]);
    assert!(c.volume("db").backup_schedules.is_empty());
    let mut ready = BTreeSet::new();
    hawser_e2e::wait_until(
        "the store and the target to agree",
        Duration::from_secs(60),
        || {
            let all = backups(&c);
            ready = all
                .iter()
                .filter(|b| b.state == BackupState::Ready)
                .map(|b| b.name.clone())
                .collect();
            all.iter().all(|b| b.state != BackupState::Running) && ready == on_target(&target)
        },
    );
    assert!(ready.contains(&manual.name), "{ready:?}");
    assert!(has_block(&target, 0x11), "the manual backup's blocks stay");
    assert!(has_block(&target, 0x23), "the newest backup's blocks stay");
    let events = c.cli_ok(&["events"]);
    assert!(
        events.contains("BackupDeleted") && events.contains("BackupTargetPruned"),
        "{events}"
    );
    // Every kept backup restores, each block checked against its hash.
    for name in &ready {
        let out = dir.path().join(format!("{name}.img"));
        hawser_backup_restores(&target, name, &out);
    }
    let newest = ready
        .iter()
        .filter(|n| **n != manual.name)
        .max_by_key(|n| hawser_backup::names::order_of(n, "db"))
        .expect("a scheduled backup kept");
    let data = std::fs::read(dir.path().join(format!("{newest}.img"))).expect("restored image");
    assert!(data[..4 * MIB_LEN].iter().all(|b| *b == 0x11));
    assert!(data[4 * MIB_LEN..5 * MIB_LEN].iter().all(|b| *b == 0x23));
    drop(s3);
}

fn hawser_backup_restores(target: &Target, backup: &str, out: &std::path::Path) {
    hawser_e2e::backups::restore_to_file(target, backup, out, SIZE);
}
