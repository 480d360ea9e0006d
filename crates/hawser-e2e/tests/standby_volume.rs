//! Standby volumes in a second cluster (issue 43 item 6, acceptance d): a cluster given only
//! the S3 target (a real SeaweedFS) keeps `dr` as a standby of the first cluster's `db`.
//! It starts as db's newest backup, applies each new backup as it lands (a changed block,
//! a block zeroed, a new block), refuses to attach, and reports its recovery point. With
//! the first cluster stopped, `hawser volume activate` makes it a normal volume whose
//! every replica, and what it reads, equal the last backup.

use std::path::Path;
use std::time::Duration;

use hawser_api::backup::{Backup, BackupState};
use hawser_backup::Target;
use hawser_e2e::cluster::{Cluster, ClusterOptions};
use hawser_e2e::run::qemu_io;
use hawser_e2e::{assert_same_contents, S3Server, TempDir};

const MIB: u64 = 1 << 20;
const SIZE: u64 = 32 * MIB;

fn backup(c: &Cluster, volume: &str) -> Backup {
    let out = c.cli_ok(&[
        "backup", "create", volume, "--target", "offsite", "--wait", "-o", "json",
    ]);
    let b: Backup = serde_json::from_str(&out).expect("backup JSON");
    assert_eq!(b.state, BackupState::Ready, "{b:?}");
    b
}

/// Waits until the standby `dr` of `c` holds `backup`.
fn wait_applied(c: &Cluster, backup: &str) {
    hawser_e2e::wait_until(
        &format!("the standby to hold {backup}"),
        Duration::from_secs(90),
        || {
            let v = c.volume("dr");
            let s = v.standby.expect("still a standby");
            assert!(s.error.is_none(), "standby error: {s:?}");
            s.applied.is_some_and(|a| a.backup == backup)
        },
    );
}

/// The controller's `/metrics`, with the metrics token.
fn metrics(c: &Cluster) -> String {
    let token = std::fs::read_to_string(c.dir.path().join("controller/metrics.token"))
        .expect("metrics token");
    let resp = c
        .controller_http()
        .get(format!("{}/metrics", c.url))
        .bearer_auth(token.trim())
        .send()
        .expect("scrape");
    assert_eq!(resp.status().as_u16(), 200);
    resp.text().expect("scrape body")
}

/// `backup` restored from the target into a file of its own, to compare replicas with.
fn image(target: &Target, backup: &str, dir: &Path) -> std::path::PathBuf {
    let out = dir.join(backup);
    hawser_e2e::backups::restore_to_file(target, backup, &out, SIZE);
    out
}

#[test]
fn a_standby_follows_backups_and_activates_as_the_last_one() {
    let dir = TempDir::new("standby-s3");
    let s3 = S3Server::start(dir.path(), "backups");
    let target = s3.target("offsite", "site-a", 120);

    // Site A: db, backed up once.
    let a = Cluster::start("standby-a", 1);
    s3.add_to(&a, "offsite", "site-a");
    let uri = a.attached_volume("db", "32MiB", 1, "n1");
    qemu_io(
        &uri,
        &[
            "write -P 0x11 0 1M",
            "write -P 0x12 1M 1M",
            "write -P 0x13 3M 1M",
            "write -P 0x55 10M 1M",
            "flush",
        ],
    );
    let first = backup(&a, "db");

    // Site B, given only the target: a standby of db on both its nodes.
    let b = Cluster::start_with(
        "standby-b",
        2,
        ClusterOptions {
            controller_args: vec!["--standby-poll-secs".into(), "1".into()],
            ..Default::default()
        },
    );
    s3.add_to(&b, "offsite", "site-a");
    b.cli_fails(
        &["volume", "create", "x", "--standby-of", "offsite/nothing"],
        "not found",
    );
    b.cli_fails(
        &["volume", "create", "x", "--standby-of", "offsite"],
        "TARGET/VOLUME",
    );
    b.cli_ok(&[
        "volume",
        "create",
        "dr",
        "--standby-of",
        "offsite/db",
        "--replicas",
        "2",
    ]);
    wait_applied(&b, &first.name);
    b.cli_fails(
        &["volume", "attach", "dr", "--node", "n1"],
        "standby of offsite/db",
    );
    let shown = b.cli_ok(&["volume", "show", "dr"]);
    assert!(
        shown.contains(&format!("Holds:    {} (recovery point", first.name)),
        "{shown}"
    );

    // A changed block, a block zeroed and a new one: the standby applies the next backup,
    // and every replica equals it.
    qemu_io(
        &uri,
        &[
            "write -P 0x66 1M 1M",
            "write -z 10M 1M",
            "write -P 0x77 20M 1M",
            "flush",
        ],
    );
    let second = backup(&a, "db");
    wait_applied(&b, &second.name);
    let img = image(&target, &second.name, dir.path());
    for r in b.volume("dr").replicas {
        assert_same_contents(&img, &b.replica_path(&r.id), SIZE);
    }
    let events = b.cli_ok(&["events"]);
    assert!(events.contains("StandbyApplied"), "{events}");
    let scrape = metrics(&b);
    assert!(
        scrape.contains(
            "hawser_standby_recovery_point_age_seconds{volume=\"dr\",target=\"offsite\"}"
        ) && scrape.contains("hawser_standby_failing{volume=\"dr\"} 0"),
        "{scrape}"
    );

    // One more backup, then site A is gone. Site B reported the recovery point of what it
    // holds before it is activated; activation leaves the newest backup on every replica.
    qemu_io(&uri, &["write -P 0x88 3M 1M", "flush"]);
    let third = backup(&a, "db");
    drop(a);
    wait_applied(&b, &third.name);
    let v = b.volume("dr");
    let held = v.standby.and_then(|s| s.applied).expect("a backup held");
    assert_eq!(held.taken_ms, third.taken_ms, "the recovery point");
    b.cli_fails(&["volume", "activate", "db", "--wait"], "not found");
    let out = b.cli_ok(&["volume", "activate", "dr", "--wait"]);
    assert!(out.contains("activated"), "{out}");
    let v = b.volume("dr");
    assert!(v.standby.is_none() && v.restoring.is_none(), "{v:?}");
    b.cli_fails(&["volume", "activate", "dr"], "not a standby");
    let img = image(&target, &third.name, dir.path());
    for r in &v.replicas {
        assert_same_contents(&img, &b.replica_path(&r.id), SIZE);
    }
    b.cli_ok(&["volume", "attach", "dr", "--node", "n2"]);
    let dr = b.volume("dr").nbd_unix_uri.expect("an NBD URI");
    let io = qemu_io(
        &dr,
        &[
            "read -P 0x11 0 1M",
            "read -P 0x66 1M 1M",
            "read -P 0x88 3M 1M",
            "read -P 0 10M 1M",
            "read -P 0x77 20M 1M",
            "write -P 0x99 5M 1M",
            "read -P 0x99 5M 1M",
        ],
    );
    assert!(!io.contains("verification failed"), "{io}");
    drop(s3);
}
