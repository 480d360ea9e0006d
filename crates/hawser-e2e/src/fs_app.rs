//! An application on a filesystem over a kernel block device, for the guest tests
//! (`kernel_devices`, `kernel_growth`): it writes self-describing 4 KiB blocks into one file,
//! one at a time with an fdatasync after each, and remembers what was acknowledged, what
//! failed and the longest write. `verify` reads the file back against that.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::write_log::block_content;
use crate::Cluster;

/// The application's file, in 4 KiB blocks.
pub const FILE_BLOCKS: u64 = 2048;
const SEED: u64 = 42;
/// How long `wait_acks` waits for the writes it asks for.
const ACK_TIMEOUT: Duration = Duration::from_secs(240);

/// What the application saw.
#[derive(Default, Debug)]
pub struct Seen {
    pub acked: u64,
    pub errors: Vec<String>,
    /// The last acknowledged write of each block (its sequence number).
    pub last: std::collections::HashMap<u64, u64>,
    /// The longest write + fdatasync, and when it ended.
    pub longest: Duration,
}

/// An application: writes self-describing 4 KiB blocks into a file on the filesystem,
/// fdatasync after each, one at a time; a write is acknowledged once fdatasync returned.
pub struct App {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Seen>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl App {
    pub fn start(path: &Path) -> App {
        let file = File::options()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(path)
            .expect("open the application's file");
        file.set_len(FILE_BLOCKS * 4096).expect("size the file");
        file.sync_all().expect("sync the file");
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (s, sn) = (stop.clone(), seen.clone());
        let thread = std::thread::spawn(move || {
            let mut seq = 1u64;
            while !s.load(Ordering::Acquire) {
                // A stride that visits every block before coming back to one.
                let block = (seq * 7) % FILE_BLOCKS;
                let data = block_content(SEED, block, seq);
                let t = Instant::now();
                let r = file
                    .write_all_at(&data, block * 4096)
                    .and_then(|()| file.sync_data());
                let took = t.elapsed();
                let mut g = sn.lock().expect("lock");
                g.longest = g.longest.max(took);
                match r {
                    Ok(()) => {
                        g.acked += 1;
                        g.last.insert(block, seq);
                    }
                    Err(e) => g.errors.push(format!("write {seq} (block {block}): {e}")),
                }
                seq += 1;
            }
        });
        App {
            stop,
            seen,
            thread: Some(thread),
        }
    }

    /// Whether any write has failed so far.
    pub fn has_errors(&self) -> bool {
        !self.seen.lock().expect("lock").errors.is_empty()
    }

    pub fn acked(&self) -> u64 {
        self.seen.lock().expect("lock").acked
    }

    pub fn wait_acks(&self, n: u64) {
        let start = Instant::now();
        let target = self.acked() + n;
        while self.acked() < target {
            let errors = self.seen.lock().expect("lock").errors.clone();
            assert!(errors.is_empty(), "the application saw errors: {errors:?}");
            assert!(
                start.elapsed() < ACK_TIMEOUT,
                "{n} more acknowledged writes did not come within {ACK_TIMEOUT:?} ({} so far)",
                self.acked()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn stop(mut self) -> Seen {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.join().expect("writer thread");
        }
        std::mem::take(&mut *self.seen.lock().expect("lock"))
    }
}

/// `hawser device ARGS` against node n1's agent.
pub fn device_cli(c: &Cluster, args: &[&str]) -> String {
    let sock = c.agent("n1").data_dir.join("device.sock");
    let mut all = vec!["device"];
    all.extend_from_slice(args);
    let sock = sock.display().to_string();
    all.extend_from_slice(&["--socket", &sock]);
    crate::run::run_ok(&crate::cluster::hawser_bin().display().to_string(), &all)
}

/// Every block holds its last acknowledged write.
pub fn verify(path: &Path, seen: &Seen) {
    let file = File::open(path).expect("open the file again");
    let mut buf = vec![0u8; 4096];
    for (&block, &seq) in &seen.last {
        file.read_exact_at(&mut buf, block * 4096)
            .expect("read back");
        assert!(
            buf == block_content(SEED, block, seq),
            "block {block} lost its acknowledged write {seq}"
        );
    }
}
