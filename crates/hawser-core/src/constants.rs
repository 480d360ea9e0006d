//! Bounds of the replication core.

/// Most replicas a volume can have (replica sets are bit sets in a u32; 8 is plenty).
pub const MAX_REPLICAS: usize = 8;
