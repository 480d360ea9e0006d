//! This node's storage: its pools and the lookups across them ([`pools`]), and the fixed pool of
//! threads that does the data path's blocking disk I/O ([`io_pool`]). The on-disk formats are
//! `hawser_storage`'s; nothing here knows engines or the network.

pub mod io_pool;
pub mod pools;
