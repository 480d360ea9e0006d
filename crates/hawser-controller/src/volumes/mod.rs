//! A volume's lifecycle, one file per operation the API offers: create (placement and the
//! replicas' creation, rolled back on failure), attach (the engine started with an epoch
//! grant), outdate (the compare-and-swap that takes a replica out of the in-sync set before
//! a write it missed is acknowledged), expand, clone, restore, scrub, QoS, force-promote,
//! delete; and the volume encryption keys (`keys`, `key_rotation`). Each operation holds
//! the volume's lock (`store::locks`) and writes the volume record by compare-and-swap; the
//! routes in `api::volumes` only parse and call these. Nothing here decides on its own:
//! repairs that happen without a request are in `healing/`, `ha/` and `cluster/`.

pub(crate) mod attach;
pub(crate) mod clone;
pub(crate) mod create;
pub(crate) mod delete;
pub(crate) mod expand;
pub(crate) mod force_promote;
pub(crate) mod key_rotation;
pub mod keys;
pub(crate) mod outdate;
pub(crate) mod qos;
pub(crate) mod restore;
pub(crate) mod scrub;
