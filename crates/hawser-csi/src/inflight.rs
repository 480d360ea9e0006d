//! One operation per volume at a time: the CSI spec lets a plugin answer ABORTED when an
//! operation on the same volume is already in progress, and the CO retries later. This keeps
//! two retries of a slow stage (mkfs) or publish from racing each other.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use tonic::Status;

#[derive(Clone, Default)]
pub struct InFlight(Arc<Mutex<HashSet<String>>>);

/// Held while an operation on one volume runs.
pub struct Guard {
    set: InFlight,
    id: String,
}

impl InFlight {
    pub fn begin(&self, id: &str) -> Result<Guard, Status> {
        let mut set = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if !set.insert(id.to_string()) {
            return Err(Status::aborted(format!(
                "another operation on {id} is in progress; retry when it ends"
            )));
        }
        Ok(Guard {
            set: self.clone(),
            id: id.to_string(),
        })
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let mut set = self.set.0.lock().unwrap_or_else(|p| p.into_inner());
        set.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_operation_on_a_volume_is_aborted_until_the_first_ends() {
        let f = InFlight::default();
        let g = f.begin("v").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            f.begin("v").err().map(|s| s.code()),
            Some(tonic::Code::Aborted)
        );
        assert!(f.begin("w").is_ok());
        drop(g);
        assert!(f.begin("v").is_ok());
    }
}
