//! "Kubernetes CSI driver", acceptance c, d and e, against `hawser csi` on a local cluster:
//! stage / publish / unpublish / unstage cycles on a real filesystem leave nothing behind;
//! bad requests get the right gRPC code and create nothing; a node service restarted while
//! a volume is staged finds it again.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use hawser_csi::proto::csi::volume_capability::access_mode::Mode;
use hawser_csi::proto::csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use hawser_csi::proto::csi::*;
use hawser_e2e::{wait_until, Cluster, CsiProc};
use tonic::Code;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn mount_cap(fs: &str) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter.into(),
        }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs.into(),
            ..Default::default()
        })),
    }
}

fn block_cap() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter.into(),
        }),
        access_type: Some(AccessType::Block(BlockVolume {})),
    }
}

fn create_req(name: &str, size: i64, params: &[(&str, &str)]) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: size,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![mount_cap("ext4")],
        parameters: params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    }
}

/// Lines of /proc/self/mountinfo, losetup -a and the process table that name `dir`.
fn leftovers(dir: &Path) -> Vec<String> {
    let d = dir.display().to_string();
    let mut left: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(&d))
        .map(|l| format!("mount: {l}"))
        .collect();
    let loops = Command::new("losetup")
        .arg("-a")
        .output()
        .expect("losetup -a");
    left.extend(
        String::from_utf8_lossy(&loops.stdout)
            .lines()
            .filter(|l| l.contains(&d))
            .map(|l| format!("loop: {l}")),
    );
    let ps = Command::new("ps")
        .args(["-eo", "pid,args"])
        .output()
        .expect("ps");
    left.extend(
        String::from_utf8_lossy(&ps.stdout)
            .lines()
            .filter(|l| l.contains(&d) && l.contains("nbdfuse"))
            .map(|l| format!("process: {l}")),
    );
    left
}

struct Paths {
    staging: PathBuf,
    target: PathBuf,
}

fn paths(csi: &CsiProc, name: &str) -> Paths {
    Paths {
        staging: csi
            .kubelet_dir
            .join("plugins/csi.hawser.dev/staging")
            .join(name),
        target: csi.kubelet_dir.join("pods/p1/volumes").join(name),
    }
}

async fn create_and_publish(
    csi: &CsiProc,
    name: &str,
    node: &str,
) -> (String, HashMap<String, String>) {
    let mut ctl = csi.controller().await;
    let vol = ctl
        .create_volume(create_req(name, 64 << 20, &[]))
        .await
        .expect("CreateVolume")
        .into_inner()
        .volume
        .expect("volume");
    let ctx = ctl
        .controller_publish_volume(ControllerPublishVolumeRequest {
            volume_id: vol.volume_id.clone(),
            node_id: node.into(),
            volume_capability: Some(mount_cap("ext4")),
            ..Default::default()
        })
        .await
        .expect("ControllerPublishVolume")
        .into_inner()
        .publish_context;
    (vol.volume_id, ctx)
}

async fn stage(csi: &CsiProc, id: &str, ctx: &HashMap<String, String>, p: &Paths) {
    csi.node()
        .await
        .node_stage_volume(NodeStageVolumeRequest {
            volume_id: id.into(),
            publish_context: ctx.clone(),
            staging_target_path: p.staging.display().to_string(),
            volume_capability: Some(mount_cap("ext4")),
            ..Default::default()
        })
        .await
        .expect("NodeStageVolume");
}

async fn publish(csi: &CsiProc, id: &str, p: &Paths) {
    csi.node()
        .await
        .node_publish_volume(NodePublishVolumeRequest {
            volume_id: id.into(),
            staging_target_path: p.staging.display().to_string(),
            target_path: p.target.display().to_string(),
            volume_capability: Some(mount_cap("ext4")),
            ..Default::default()
        })
        .await
        .expect("NodePublishVolume");
}

async fn unpublish_unstage(csi: &CsiProc, id: &str, p: &Paths) {
    let mut node = csi.node().await;
    node.node_unpublish_volume(NodeUnpublishVolumeRequest {
        volume_id: id.into(),
        target_path: p.target.display().to_string(),
    })
    .await
    .expect("NodeUnpublishVolume");
    node.node_unstage_volume(NodeUnstageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: p.staging.display().to_string(),
    })
    .await
    .expect("NodeUnstageVolume");
}

#[test]
fn stage_publish_unpublish_unstage_twenty_times_leaves_nothing_behind() {
    let c = Cluster::start("csicycles", 2);
    let csi = CsiProc::start(&c, "n1", &c.dir.path().join("csi"));
    let rt = runtime();
    rt.block_on(async {
        let (id, ctx) = create_and_publish(&csi, "cycles", "n1").await;
        let p = paths(&csi, "cycles");
        for round in 0..20 {
            stage(&csi, &id, &ctx, &p).await;
            publish(&csi, &id, &p).await;
            // The file written in the previous round is there: the filesystem was made once
            // and mounted again, never formatted over.
            let file = p.target.join("rounds");
            let before = std::fs::read_to_string(&file).unwrap_or_default();
            assert_eq!(before.lines().count(), round, "round {round}: {before:?}");
            std::fs::write(&file, format!("{before}{round}\n")).expect("write to the volume");
            unpublish_unstage(&csi, &id, &p).await;
            let left = leftovers(&csi.dir);
            assert!(left.is_empty(), "round {round} left: {left:#?}");
            assert!(!p.target.exists(), "round {round}: target path not removed");
        }
    });
}

fn code<T>(r: Result<T, tonic::Status>) -> Code {
    match r {
        Ok(_) => Code::Ok,
        Err(s) => s.code(),
    }
}

#[test]
fn bad_requests_get_the_right_code_and_create_nothing() {
    let mut c = Cluster::start("csibad", 2);
    let csi = CsiProc::start(&c, "n1", &c.dir.path().join("csi"));
    let rt = runtime();
    rt.block_on(async {
        let mut ctl = csi.controller().await;
        let mut node = csi.node().await;
        let mut no_caps = create_req("v1", 1 << 20, &[]);
        no_caps.volume_capabilities.clear();
        let mut limit_below = create_req("v2", 8 << 20, &[]);
        limit_below.capacity_range = Some(CapacityRange {
            required_bytes: 8 << 20,
            limit_bytes: 4 << 20,
        });
        let mut no_room = create_req("v3", 4097, &[]);
        no_room.capacity_range = Some(CapacityRange {
            required_bytes: 4097,
            limit_bytes: 5000,
        });
        let cases: Vec<(&str, CreateVolumeRequest, Code)> = vec![
            (
                "no name",
                create_req("", 1 << 20, &[]),
                Code::InvalidArgument,
            ),
            ("no capabilities", no_caps, Code::InvalidArgument),
            ("limit below required", limit_below, Code::InvalidArgument),
            ("no 4 KiB multiple in range", no_room, Code::OutOfRange),
            (
                "unknown parameter",
                create_req("v4", 1 << 20, &[("replica", "2")]),
                Code::InvalidArgument,
            ),
            (
                "bad replica count",
                create_req("v5", 1 << 20, &[("replicas", "9")]),
                Code::InvalidArgument,
            ),
            (
                "too many replicas for the nodes",
                create_req("v6", 1 << 20, &[("replicas", "3")]),
                Code::ResourceExhausted,
            ),
            (
                "bigger than any pool",
                create_req("v7", 1 << 45, &[("provisioning", "thick")]),
                Code::ResourceExhausted,
            ),
        ];
        for (what, req, want) in cases {
            let got = code(ctl.create_volume(req).await);
            assert_eq!(got, want, "CreateVolume with {what}");
        }
        let missing = "no-such-volume".to_string();
        let got = code(
            ctl.controller_publish_volume(ControllerPublishVolumeRequest {
                volume_id: missing.clone(),
                node_id: "n1".into(),
                volume_capability: Some(mount_cap("")),
                ..Default::default()
            })
            .await,
        );
        assert_eq!(got, Code::NotFound, "ControllerPublish of a missing volume");
        let got = code(
            ctl.controller_publish_volume(ControllerPublishVolumeRequest {
                volume_id: String::new(),
                node_id: "n1".into(),
                volume_capability: Some(mount_cap("")),
                ..Default::default()
            })
            .await,
        );
        assert_eq!(
            got,
            Code::InvalidArgument,
            "ControllerPublish without a volume id"
        );
        let got = code(
            ctl.controller_expand_volume(ControllerExpandVolumeRequest {
                volume_id: missing.clone(),
                capacity_range: Some(CapacityRange {
                    required_bytes: 1 << 30,
                    limit_bytes: 0,
                }),
                ..Default::default()
            })
            .await,
        );
        assert_eq!(got, Code::NotFound, "ControllerExpand of a missing volume");
        let got = code(
            ctl.controller_get_volume(ControllerGetVolumeRequest {
                volume_id: missing.clone(),
            })
            .await,
        );
        assert_eq!(
            got,
            Code::NotFound,
            "ControllerGetVolume of a missing volume"
        );
        // Paths outside the kubelet's directory are never mounted over.
        let inside = csi.kubelet_dir.join("staging/x").display().to_string();
        for (what, staging) in [
            ("outside", "/etc/hawser-test".to_string()),
            ("relative", "kubelet/staging".to_string()),
            (
                "dot-dot",
                format!("{}/../../etc", csi.kubelet_dir.display()),
            ),
        ] {
            let got = code(
                node.node_stage_volume(NodeStageVolumeRequest {
                    volume_id: "v".into(),
                    staging_target_path: staging.clone(),
                    volume_capability: Some(mount_cap("")),
                    ..Default::default()
                })
                .await,
            );
            assert_eq!(
                got,
                Code::InvalidArgument,
                "NodeStage at a path {what}: {staging}"
            );
            let got = code(
                node.node_publish_volume(NodePublishVolumeRequest {
                    volume_id: "v".into(),
                    staging_target_path: inside.clone(),
                    target_path: staging.clone(),
                    volume_capability: Some(mount_cap("")),
                    ..Default::default()
                })
                .await,
            );
            assert_eq!(
                got,
                Code::InvalidArgument,
                "NodePublish at a path {what}: {staging}"
            );
        }
        let got = code(
            node.node_stage_volume(NodeStageVolumeRequest {
                volume_id: missing.clone(),
                staging_target_path: inside.clone(),
                volume_capability: Some(mount_cap("")),
                ..Default::default()
            })
            .await,
        );
        assert_eq!(got, Code::NotFound, "NodeStage of a missing volume");
        let got = code(
            node.node_get_volume_stats(NodeGetVolumeStatsRequest {
                volume_id: missing.clone(),
                volume_path: inside.clone(),
                ..Default::default()
            })
            .await,
        );
        assert_eq!(
            got,
            Code::NotFound,
            "NodeGetVolumeStats of a volume not staged"
        );
        let got = code(
            node.node_stage_volume(NodeStageVolumeRequest {
                volume_id: "v".into(),
                staging_target_path: inside.clone(),
                volume_capability: Some(block_cap()),
                ..Default::default()
            })
            .await,
        );
        assert_eq!(
            got,
            Code::NotFound,
            "NodeStage of a volume that does not exist"
        );
    });
    assert!(
        c.volumes().is_empty(),
        "a refused request created {:?}",
        c.volumes()
    );
    for a in &c.agents {
        assert!(
            c.agent_status(&a.name).replicas.is_empty(),
            "replica left on {}",
            a.name
        );
    }
    assert!(leftovers(&csi.dir).is_empty());
    assert!(!Path::new("/etc/hawser-test").exists());
    // The controller down: UNAVAILABLE (the CO retries), with what to check in the message.
    c.kill_controller(0);
    let status = rt
        .block_on(async {
            csi.controller()
                .await
                .create_volume(create_req("v8", 1 << 20, &[]))
                .await
        })
        .expect_err("CreateVolume with the controller down");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("controller"),
        "{}",
        status.message()
    );
}

#[test]
fn a_node_service_restarted_while_a_volume_is_staged_finds_it_again() {
    let c = Cluster::start("csirestart", 2);
    let mut csi = CsiProc::start(&c, "n1", &c.dir.path().join("csi"));
    let rt = runtime();
    let (id, ctx, p) = rt.block_on(async {
        let (id, ctx) = create_and_publish(&csi, "restart", "n1").await;
        let p = paths(&csi, "restart");
        stage(&csi, &id, &ctx, &p).await;
        publish(&csi, &id, &p).await;
        std::fs::write(p.target.join("before"), "written before the restart\n").expect("write");
        (id, ctx, p)
    });
    csi.restart();
    rt.block_on(async {
        // The volume stays usable across the restart: the mount and its device outlive it.
        let before = std::fs::read_to_string(p.target.join("before")).expect("read after restart");
        assert_eq!(before, "written before the restart\n");
        // A second NodeStage and NodePublish are idempotent.
        stage(&csi, &id, &ctx, &p).await;
        publish(&csi, &id, &p).await;
        let stats = csi
            .node()
            .await
            .node_get_volume_stats(NodeGetVolumeStatsRequest {
                volume_id: id.clone(),
                volume_path: p.target.display().to_string(),
                ..Default::default()
            })
            .await
            .expect("NodeGetVolumeStats after restart")
            .into_inner();
        assert!(
            !stats.usage.is_empty() && stats.usage[0].total > 0,
            "{stats:?}"
        );
        unpublish_unstage(&csi, &id, &p).await;
    });
    let left = leftovers(&csi.dir);
    assert!(left.is_empty(), "left after unstage: {left:#?}");
}

#[test]
fn publishing_elsewhere_is_refused_while_the_old_node_lives_and_fences_it_once_offline() {
    let c = Cluster::start("csifence", 3);
    let csi = CsiProc::start(&c, "n1", &c.dir.path().join("csi"));
    let rt = runtime();
    let publish = |node: &str| {
        let req = ControllerPublishVolumeRequest {
            volume_id: "fence".into(),
            node_id: node.into(),
            volume_capability: Some(mount_cap("ext4")),
            ..Default::default()
        };
        rt.block_on(async { csi.controller().await.controller_publish_volume(req).await })
    };
    rt.block_on(async {
        let mut ctl = csi.controller().await;
        ctl.create_volume(create_req("fence", 64 << 20, &[]))
            .await
            .expect("CreateVolume");
    });
    // The engine goes to the node without a replica, so freezing it loses no replica.
    let v = c.volume("fence");
    let nodes = ["n1", "n2", "n3"];
    let old = *nodes
        .iter()
        .find(|n| v.replicas.iter().all(|r| r.node != **n))
        .expect("a free node");
    let new = v.replicas[0].node.clone();
    publish(old).expect("publish on the free node");
    let first = c.volume("fence").epoch;
    // The old node is alive: the volume stays there, whoever asks.
    assert_eq!(code(publish(&new)), Code::FailedPrecondition);
    assert_eq!(c.volume("fence").attached_node.as_deref(), Some(old));
    // It stops answering (its agent frozen, as a hung node): once it is offline, publishing
    // elsewhere moves the volume, in a new epoch the replicas then hold.
    c.pause_agent(old);
    wait_until("the old node offline", Duration::from_secs(60), || {
        c.nodes()
            .iter()
            .any(|n| n.name == old && n.state == hawser_api::controller::NodeState::Offline)
    });
    let ctx = publish(&new)
        .expect("publish after the old node went offline")
        .into_inner();
    let v = c.volume("fence");
    assert_eq!(v.attached_node.as_deref(), Some(new.as_str()));
    assert!(v.epoch > first, "epoch {} not above {first}", v.epoch);
    assert_eq!(ctx.publish_context.get("epoch"), Some(&v.epoch.to_string()));
    for r in &v.replicas {
        let held = c
            .agent_status(&r.node)
            .replicas
            .into_iter()
            .find(|s| s.replica_id == r.id)
            .map(|s| s.epoch);
        assert_eq!(
            held,
            Some(v.epoch),
            "replica {} on {} does not fence epoch {first}",
            r.id,
            r.node
        );
    }
    c.resume_agent(old);
}
