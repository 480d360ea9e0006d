//! NBD protocol messages (newstyle fixed handshake and transmission), big-endian.
