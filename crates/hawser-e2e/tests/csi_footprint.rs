//! "Kubernetes CSI driver", performance and footprint, for `make bench` (ignored by `make
//! test`: it measures, it does not assert): the time from CreateVolume to the first durable
//! write through the CSI calls a kubelet makes, and the idle memory and CPU of the agent and
//! `hawser csi` together (target: 64 MiB RSS, ~0 CPU).

use std::collections::HashMap;
use std::io::Write;
use std::time::{Duration, Instant};

use hawser_csi::proto::csi::volume_capability::access_mode::Mode;
use hawser_csi::proto::csi::volume_capability::{AccessMode, AccessType, MountVolume};
use hawser_csi::proto::csi::*;
use hawser_e2e::run::cpu_ticks;
use hawser_e2e::{Cluster, CsiProc};

/// How long the processes are watched while idle.
const IDLE: Duration = Duration::from_secs(5);

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn cap() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter.into(),
        }),
        access_type: Some(AccessType::Mount(MountVolume::default())),
    }
}

#[test]
#[ignore = "a measurement for make bench"]
fn csi_time_to_first_write_and_idle_footprint() {
    let c = Cluster::start("csifootprint", 2);
    let csi = CsiProc::start(&c, "n1", &c.dir.path().join("csi"));
    let staging = csi.kubelet_dir.join("staging/v");
    let target = csi.kubelet_dir.join("pods/p/v");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let start = Instant::now();
    let id = rt.block_on(async {
        let mut ctl = csi.controller().await;
        let mut node = csi.node().await;
        let vol = ctl
            .create_volume(CreateVolumeRequest {
                name: "footprint".into(),
                capacity_range: Some(CapacityRange {
                    required_bytes: 1 << 30,
                    limit_bytes: 0,
                }),
                volume_capabilities: vec![cap()],
                ..Default::default()
            })
            .await
            .expect("CreateVolume")
            .into_inner()
            .volume
            .expect("volume");
        let ctx: HashMap<String, String> = ctl
            .controller_publish_volume(ControllerPublishVolumeRequest {
                volume_id: vol.volume_id.clone(),
                node_id: "n1".into(),
                volume_capability: Some(cap()),
                ..Default::default()
            })
            .await
            .expect("ControllerPublish")
            .into_inner()
            .publish_context;
        node.node_stage_volume(NodeStageVolumeRequest {
            volume_id: vol.volume_id.clone(),
            publish_context: ctx,
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(cap()),
            ..Default::default()
        })
        .await
        .expect("NodeStage");
        node.node_publish_volume(NodePublishVolumeRequest {
            volume_id: vol.volume_id.clone(),
            staging_target_path: staging.display().to_string(),
            target_path: target.display().to_string(),
            volume_capability: Some(cap()),
            ..Default::default()
        })
        .await
        .expect("NodePublish");
        vol.volume_id
    });
    let mut f = std::fs::File::create(target.join("first")).expect("create a file");
    f.write_all(b"first write\n").expect("write");
    f.sync_all().expect("fsync");
    let first_write = start.elapsed();
    drop(f);
    let pids = [
        ("agent n1", c.agent("n1").child.id()),
        ("hawser csi", csi.pid()),
    ];
    let before: Vec<u64> = pids.iter().map(|(_, p)| cpu_ticks(*p)).collect();
    std::thread::sleep(IDLE);
    // SAFETY: sysconf has no preconditions.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) })
        .unwrap_or(100)
        .max(1);
    println!(
        "csi: CreateVolume to the first durable write (1 GiB, 2 replicas, ext4 made): {} ms",
        first_write.as_millis()
    );
    let mut total = 0;
    for ((name, pid), b) in pids.iter().zip(before) {
        let rss = rss_kib(*pid);
        total += rss;
        let cpu_ms = (cpu_ticks(*pid) - b) * 1000 / hz;
        println!(
            "csi: idle {name}: {} MiB RSS, {cpu_ms} ms CPU in {} s",
            rss / 1024,
            IDLE.as_secs()
        );
    }
    println!(
        "csi: idle agent + hawser csi: {} MiB RSS (target 64 MiB)",
        total / 1024
    );
    rt.block_on(async {
        let mut node = csi.node().await;
        node.node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: id.clone(),
            target_path: target.display().to_string(),
        })
        .await
        .expect("NodeUnpublish");
        node.node_unstage_volume(NodeUnstageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
        })
        .await
        .expect("NodeUnstage");
    });
}
