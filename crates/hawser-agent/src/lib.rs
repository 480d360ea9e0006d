//! The Hawser node agent. One per node: it owns the node's storage pools and replicas, serves
//! them to engines on other nodes (replica server), runs the engine of every volume attached on
//! this node and exports those volumes over NBD.

pub mod block;
