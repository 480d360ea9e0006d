//! Guards for kernel state tests create: loop devices, mounts, nbdfuse exports. Each one undoes
//! itself on drop, in the right order when nested (declare the outermost first).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::run::{run_ok, sh, wait_until};

/// `losetup` on a file. Detached on drop.
pub struct LoopDevice {
    pub dev: String,
}

impl LoopDevice {
    pub fn attach(file: &Path) -> LoopDevice {
        let dev = run_ok("losetup", &["-f", "--show", &file.display().to_string()])
            .trim()
            .to_owned();
        assert!(dev.starts_with("/dev/loop"), "losetup gave {dev:?}");
        LoopDevice { dev }
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
    }
}

/// A mounted filesystem. Unmounted on drop.
pub struct Mount {
    pub dir: PathBuf,
}

impl Mount {
    pub fn new(dev: &str, dir: &Path) -> Mount {
        std::fs::create_dir_all(dir).expect("create mount point");
        run_ok("mount", &[dev, &dir.display().to_string()]);
        Mount {
            dir: dir.to_owned(),
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let d = self.dir.display().to_string();
        if !Command::new("umount")
            .arg(&d)
            .status()
            .is_ok_and(|s| s.success())
        {
            let _ = Command::new("umount").args(["-l", &d]).status();
        }
    }
}

/// A small ext4 filesystem in a file, loop-mounted (for disk-full tests).
pub struct SmallFs {
    // Field order is drop order: unmount before detaching the loop device.
    pub mount: Mount,
    _loop: LoopDevice,
    pub image: PathBuf,
}

impl SmallFs {
    /// An ext4 filesystem of `size_mib` on a loop device, mounted at `dir/small-fs`.
    pub fn new(dir: &Path, size_mib: u64) -> SmallFs {
        Self::make(dir, "small-fs", size_mib, &["mkfs.ext4", "-q", "-F"])
    }

    /// An XFS filesystem with reflinks, mounted at `dir/xfs`.
    pub fn xfs(dir: &Path, size_mib: u64) -> SmallFs {
        Self::make(
            dir,
            "xfs",
            size_mib,
            &["mkfs.xfs", "-q", "-f", "-m", "reflink=1"],
        )
    }

    fn make(dir: &Path, name: &str, size_mib: u64, mkfs: &[&str]) -> SmallFs {
        let image = dir.join(format!("{name}.img"));
        let f = std::fs::File::create(&image).expect("create fs image");
        f.set_len(size_mib << 20).expect("size fs image");
        let image_arg = image.display().to_string();
        let mut args = mkfs[1..].to_vec();
        args.push(&image_arg);
        run_ok(mkfs[0], &args);
        let lo = LoopDevice::attach(&image);
        let mount = Mount::new(&lo.dev, &dir.join(name));
        SmallFs {
            mount,
            _loop: lo,
            image,
        }
    }

    /// Bytes used on the filesystem (statvfs: blocks less free blocks).
    pub fn used_bytes(&self) -> u64 {
        let out = run_ok(
            "stat",
            &[
                "-f",
                "-c",
                "%S %b %f",
                &self.mount.dir.display().to_string(),
            ],
        );
        let v: Vec<u64> = out
            .split_whitespace()
            .map(|x| x.parse().expect("stat number"))
            .collect();
        v[0] * (v[1] - v[2])
    }
}

/// An NBD export made into a file by `nbdfuse` (the kernel here has no nbd module).
pub struct FuseExport {
    pub file: PathBuf,
    dir: PathBuf,
    child: Child,
}

impl FuseExport {
    pub fn new(uri: &str, dir: &Path) -> FuseExport {
        std::fs::create_dir_all(dir).expect("create fuse dir");
        let file = dir.join("nbd");
        let child = Command::new("nbdfuse")
            .arg(&file)
            .arg(uri)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nbdfuse");
        let probe = file.clone();
        wait_until(
            "nbdfuse to expose the export",
            Duration::from_secs(20),
            || std::fs::metadata(&probe).is_ok_and(|m| m.len() > 0),
        );
        FuseExport {
            file,
            dir: dir.to_owned(),
            child,
        }
    }
}

impl Drop for FuseExport {
    fn drop(&mut self) {
        let d = self.dir.display().to_string();
        let _ = sh(&format!(
            "fusermount3 -u {d} 2>/dev/null || umount -l {d} 2>/dev/null"
        ));
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
