//! Whether a kernel device left by an earlier life of this agent may be served again: the
//! controller's word on the volume, judged against what the device's record says it served.
//!
//! A name is not enough. While the agent was away its volume may have been deleted and
//! another created under the same name, or detached, used elsewhere, and attached here again.
//! The kernel device still holds the old attachment's state: a filesystem mounted on it, its
//! page cache, writes queued in the kernel. Serving it from today's volume would hand that
//! filesystem blocks it never wrote, and write its stale cache over them. So a device is
//! taken back only when the controller says the volume
//! - is attached to this node,
//! - is the same volume (its uid is the one the record holds), and
//! - is in the same attachment (the record's epoch is at or after the epoch the attachment
//!   began at: epochs never go down, and each attach takes a new one).
//!
//! Records written by an agent from before uids (no uid, no epoch) are judged by the node
//! alone, as that agent judged them, so an upgrade is a pause; once such a device is served
//! by this agent its record is rewritten whole.

/// A volume's attachment as the controller tells it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attachment {
    pub node: String,
    pub uid: Option<String>,
    /// The volume's epoch now.
    pub epoch: u64,
    /// The epoch its attachment began at (None: attached before controllers recorded it).
    pub attached_epoch: Option<u64>,
}

/// What a device's record says it served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Served<'a> {
    pub uid: Option<&'a str>,
    /// The epoch of the engine behind it when it was made.
    pub epoch: Option<u64>,
}

/// The judgement on a device left by the last agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Serve it again once the volume's engine runs here.
    TakeBack,
    /// Fail it with EIO: the reason, for the log and the volume's events.
    Fail(String),
}

/// Judges a device of `volume` that served `served`, the controller saying `now` (None: the
/// volume is detached or gone), at node `here`.
pub fn judge(volume: &str, here: &str, served: Served<'_>, now: Option<&Attachment>) -> Verdict {
    let Some(now) = now else {
        return Verdict::Fail(format!("volume {volume} is detached or gone"));
    };
    if now.node != here {
        return Verdict::Fail(format!("volume {volume} is attached to node {}", now.node));
    }
    if served.uid.is_some() && served.uid != now.uid.as_deref() {
        return Verdict::Fail(format!(
            "volume {volume} is now another volume of the same name (uid {}; the device \
             served uid {})",
            now.uid.as_deref().unwrap_or("none"),
            served.uid.unwrap_or("none"),
        ));
    }
    let Some(made) = served.epoch else {
        return Verdict::TakeBack;
    };
    let same_attachment = match now.attached_epoch {
        Some(began) => made >= began && made <= now.epoch,
        // Without the attachment's start, only the very epoch proves it.
        None => made == now.epoch,
    };
    if same_attachment {
        Verdict::TakeBack
    } else {
        Verdict::Fail(format!(
            "volume {volume} was detached and attached again since the device was made (at \
             epoch {made}; the attachment began at epoch {}, the volume is at {})",
            now.attached_epoch
                .map_or_else(|| "?".to_string(), |e| e.to_string()),
            now.epoch
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const U1: &str = "11111111111111111111111111111111";
    const U2: &str = "22222222222222222222222222222222";

    fn at(node: &str, uid: Option<&str>, epoch: u64, began: Option<u64>) -> Attachment {
        Attachment {
            node: node.into(),
            uid: uid.map(str::to_string),
            epoch,
            attached_epoch: began,
        }
    }

    fn served(uid: Option<&str>, epoch: Option<u64>) -> Served<'_> {
        Served { uid, epoch }
    }

    fn fails(v: Verdict, why: &str) {
        assert!(matches!(&v, Verdict::Fail(m) if m.contains(why)), "{v:?}");
    }

    #[test]
    fn the_same_attachment_of_the_same_volume_is_taken_back() {
        let now = at("n1", Some(U1), 7, Some(5));
        for made in [5, 6, 7] {
            let v = judge("v", "n1", served(Some(U1), Some(made)), Some(&now));
            assert_eq!(v, Verdict::TakeBack, "made at {made}");
        }
    }

    #[test]
    fn a_namesake_is_never_served_the_old_device() {
        let now = at("n1", Some(U2), 1, Some(1));
        fails(
            judge("v", "n1", served(Some(U1), Some(1)), Some(&now)),
            "another volume",
        );
        let legacy = at("n1", None, 1, Some(1));
        fails(
            judge("v", "n1", served(Some(U1), Some(1)), Some(&legacy)),
            "another volume",
        );
    }

    #[test]
    fn elsewhere_detached_gone_or_a_later_attachment_fails_the_device() {
        let s = served(Some(U1), Some(3));
        fails(judge("v", "n1", s, None), "detached or gone");
        fails(
            judge("v", "n1", s, Some(&at("n2", Some(U1), 4, Some(4)))),
            "node n2",
        );
        // Detached, used elsewhere, attached here again: a new attachment at epoch 5.
        let again = at("n1", Some(U1), 5, Some(5));
        fails(judge("v", "n1", s, Some(&again)), "attached again");
        // A record from the future cannot be this attachment either.
        let before = at("n1", Some(U1), 2, Some(1));
        fails(judge("v", "n1", s, Some(&before)), "attached again");
    }

    #[test]
    fn without_the_attachments_start_only_the_same_epoch_proves_it() {
        let now = at("n1", Some(U1), 4, None);
        assert_eq!(
            judge("v", "n1", served(Some(U1), Some(4)), Some(&now)),
            Verdict::TakeBack
        );
        fails(
            judge("v", "n1", served(Some(U1), Some(3)), Some(&now)),
            "attached again",
        );
    }

    #[test]
    fn records_from_before_uids_are_judged_by_node_as_their_agent_did() {
        let now = at("n1", Some(U1), 9, Some(2));
        assert_eq!(
            judge("v", "n1", served(None, None), Some(&now)),
            Verdict::TakeBack
        );
        fails(
            judge(
                "v",
                "n1",
                served(None, None),
                Some(&at("n2", None, 9, None)),
            ),
            "node n2",
        );
    }
}
