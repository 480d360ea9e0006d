//! The cluster store.
