//! Which kernel device serves each volume on this node, and through which frontend:
//! `hawser_kernel_device{volume, frontend, device} 1` while the device is served. Kept by
//! [`crate::frontends::devices`] as devices come and go; clones share the family.

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

type Labels = Vec<(&'static str, String)>;

#[derive(Clone, Default)]
pub struct DeviceMetrics {
    devices: Family<Labels, Gauge>,
}

fn labels(volume: &str, frontend: &str, device: &str) -> Labels {
    vec![
        ("volume", volume.to_owned()),
        ("frontend", frontend.to_owned()),
        ("device", device.to_owned()),
    ]
}

impl DeviceMetrics {
    pub(crate) fn register(&self, h: &mut Registry) {
        h.register(
            "kernel_device",
            "Kernel block devices this agent serves (1 each), by volume, frontend and device",
            self.devices.clone(),
        );
    }

    pub fn served(&self, volume: &str, frontend: &str, device: &str) {
        self.devices
            .get_or_create(&labels(volume, frontend, device))
            .set(1);
    }

    pub fn gone(&self, volume: &str, frontend: &str, device: &str) {
        self.devices.remove(&labels(volume, frontend, device));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(m: &DeviceMetrics) -> String {
        let mut r = Registry::default();
        m.register(&mut r);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &r).expect("encode");
        out
    }

    #[test]
    fn a_device_shows_while_served() {
        let m = DeviceMetrics::default();
        m.served("v1", "ublk", "/dev/ublkb0");
        let t = text(&m);
        assert!(
            t.contains(r#"kernel_device{volume="v1",frontend="ublk",device="/dev/ublkb0"} 1"#),
            "{t}"
        );
        m.gone("v1", "ublk", "/dev/ublkb0");
        assert!(!text(&m).contains("v1"), "still shown after it went");
    }
}
