//! The dashboard in a real browser (Debian's Chromium, driven by playwright-core from
//! `ui/tests/dashboard.mjs`) against a real 3-node cluster: log in (a wrong token refused),
//! see the three nodes, create a volume through the page (and a name with HTML in it refused,
//! its message shown as text), see the volume degraded while a replica's agent is killed,
//! see it resync to whole after the agent is back, detach and delete it through the page;
//! the volume's IOPS sparkline while it is written, and the recent events (the outdate, the
//! node gone silent and back, the resync) as they happen; a backup's progress, then its
//! recovery point. The viewport is a phone's.
//! Screenshots of every phase are kept in the test's target directory.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use hawser_e2e::cluster::{Cluster, ClusterOptions};
use hawser_e2e::run::{have, qemu_io};

fn ui_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ui")
}

fn phase(c: &Cluster, shots: &Path, name: &str) {
    let url = format!("{}/ui/", c.url.split(',').next().expect("a controller URL"));
    let token = std::fs::read_to_string(&c.tokens.admin).expect("the admin token");
    let out = Command::new("node")
        .arg("tests/dashboard.mjs")
        .arg(name)
        .current_dir(ui_dir())
        .env("HAWSER_UI_URL", &url)
        .env("HAWSER_UI_TOKEN", token.trim())
        .env("HAWSER_UI_SHOTS", shots)
        .output()
        .expect("run node");
    eprintln!("{}", String::from_utf8_lossy(&out.stdout));
    assert!(
        out.status.success(),
        "dashboard phase {name} failed (screenshots in {}): {}",
        shots.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_dashboard_shows_a_degraded_volume_resync_and_manages_volumes() {
    assert!(
        have("node"),
        "this test needs node (Node.js 20 or newer; make test does not install it: see make doctor)"
    );
    let ready = have("qemu-io")
        && Path::new("/usr/bin/chromium").exists()
        && ui_dir().join("node_modules/playwright-core").exists();
    assert!(
        ready,
        "this test needs qemu-io, /usr/bin/chromium and ui/node_modules (make test installs them)"
    );
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-screenshots");
    let _ = std::fs::remove_dir_all(&shots);
    std::fs::create_dir_all(&shots).expect("screenshot directory");
    eprintln!("screenshots: {}", shots.display());

    // A slow resync (2 MiB/s, busy or not), so the page has several polls to show its
    // progress: 16 MiB missed takes about 8 s to copy.
    // A slow backup too (2 MiB/s of the volume read), for the same reason.
    let opts = ClusterOptions {
        agent_args: ["--resync-rate", "2MiB", "--resync-busy-rate", "0"]
            .map(String::from)
            .to_vec(),
        controller_args: ["--backup-rate", "2097152"].map(String::from).to_vec(),
        ..ClusterOptions::default()
    };
    let mut c = Cluster::start_with("dashboard", 3, opts);
    phase(&c, &shots, "login");

    c.cli_ok(&["volume", "attach", "web", "--node", "n1"]);
    let uri = c.volume("web").nbd_unix_uri.expect("a unix URI");
    qemu_io(&uri, &["write -P 0x5a 0 4M", "flush"]);
    let away = c
        .volume("web")
        .replicas
        .iter()
        .map(|r| r.node.clone())
        .find(|n| n != "n1")
        .expect("a replica on another node");
    // Live rates: the page's IOPS sparkline shows writes while they run.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (uri, stop) = (uri.clone(), stop.clone());
        std::thread::spawn(move || {
            let writes: Vec<String> = (0..200)
                .map(|i| format!("write -P 0x{:02x} {}k 4k", i % 256, (i % 64) * 4))
                .collect();
            let mut cmds: Vec<&str> = writes.iter().map(String::as_str).collect();
            cmds.push("flush");
            let mut rounds = 0u32;
            while !stop.load(Ordering::Relaxed) {
                qemu_io(&uri, &cmds);
                rounds += 1;
            }
            rounds
        })
    };
    phase(&c, &shots, "io");
    stop.store(true, Ordering::Relaxed);
    let rounds = writer.join().expect("the writer");
    assert!(rounds > 0, "the writer wrote");

    c.kill_agent(&away);
    // Writes the lost replica misses: the engine outdates it and the page shows it degraded.
    qemu_io(&uri, &["write -P 0x6b 8M 16M", "flush"]);
    phase(&c, &shots, "degraded");

    c.restart_agent(&away);
    phase(&c, &shots, "resync");
    let events = c.cli_ok(&["events", "--volume", "web"]);
    for reason in ["Resynced", "Degraded", "Attached", "Created"] {
        assert!(
            events.contains(reason),
            "`hawser events` lacks {reason}: {events}"
        );
    }
    // A backup to a directory target, shown running with its progress, then ready.
    let target = c.dir.path().join("backups");
    std::fs::create_dir_all(&target).expect("the target directory");
    let target = target.display().to_string();
    c.cli_ok(&["backup", "target", "add", "local", "--dir", &target]);
    c.cli_ok(&["backup", "create", "web", "--target", "local"]);
    phase(&c, &shots, "backups");
    phase(&c, &shots, "delete");
    assert!(
        c.volumes().iter().all(|v| v.name != "web"),
        "the page deleted the volume"
    );
    let taken = std::fs::read_dir(&shots).expect("screenshots").count();
    assert!(taken >= 9, "{taken} screenshots");
}
