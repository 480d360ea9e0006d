//! The engine's driver: the rules between the engine and the disks and sockets that both the
//! agent and the simulator run (issue 17 moves the rest of it here). So far: crash
//! recovery's decision.

pub mod recovery;
