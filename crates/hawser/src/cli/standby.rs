//! Standby volumes in the CLI (docs/backup.md): `hawser volume activate`, and what
//! `hawser volume show` says of a standby.

use hawser_api::backup::{ActivateVolume, Standby};
use hawser_api::controller::Volume;

use crate::cli::client::{CliError, Client};
use crate::cli::output::ago;

/// `hawser volume activate NAME [--as-is] [--wait]`: the standby becomes a normal volume
/// once the newest backup is applied (or at once with `--as-is`). With `--wait`, returns
/// when it has, printing each apply; fails with the standby's error if one comes up.
pub fn activate(client: &Client, name: &str, as_is: bool, wait: bool) -> Result<Volume, CliError> {
    let path = format!("/v1/volumes/{name}/activate");
    let mut v: Volume = client.post(&path, &ActivateVolume { as_is })?;
    let mut last = String::new();
    if !wait {
        return Ok(v);
    }
    while let Some(s) = &v.standby {
        if let Some(e) = &s.error {
            return Err(CliError::Api(hawser_api::ApiError::new(
                hawser_api::ErrorCode::Unavailable,
                format!(
                    "volume {name} is still a standby: {e}. Run `hawser volume activate {name}` \
                     again once that is mended, or with --as-is to keep the backup it holds"
                ),
            )));
        }
        let line = match &s.applying {
            Some(b) => format!("applying backup {b}"),
            None => "reading the target for a newer backup".to_string(),
        };
        if line != last {
            eprintln!("{line}");
            last = line;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
        v = client.get(&format!("/v1/volumes/{name}"))?;
    }
    Ok(v)
}

/// `hawser volume show`'s lines for a standby: what it follows, the backup it holds (the
/// recovery point, and how old it is), the apply under way, and the last error.
pub fn lines(s: &Standby, now_ms: u64) -> Vec<(&'static str, String)> {
    let mut out = vec![("Standby:", format!("of {}/{}", s.target, s.source))];
    let held = match &s.applied {
        Some(a) => format!(
            "{} (recovery point {}, {} ago)",
            a.backup,
            hawser_api::time::rfc3339(a.taken_ms / 1000),
            ago(a.taken_ms, now_ms)
        ),
        None => "none yet (the first restore runs)".to_string(),
    };
    out.push(("Holds:", held));
    if let Some(b) = &s.applying {
        out.push(("Applying:", b.clone()));
    }
    if let Some(c) = s.checked_ms {
        out.push(("Checked:", format!("{} ago", ago(c, now_ms))));
    }
    if s.activating {
        out.push((
            "Activate:",
            "asked: the newest backup is applied first".into(),
        ));
    }
    if let Some(e) = &s.error {
        out.push(("Error:", e.clone()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use hawser_api::backup::AppliedBackup;

    #[test]
    fn a_standby_shows_its_recovery_point_and_age() {
        let s = Standby {
            target: "offsite".into(),
            source: "db".into(),
            applied: Some(AppliedBackup {
                backup: "db-20261128-101500".into(),
                taken_ms: 1_795_860_900_000,
                applied_ms: 1_795_860_960_000,
            }),
            applying: Some("db-20261128-111500".into()),
            activating: false,
            checked_ms: Some(1_795_864_500_000),
            error: Some("cannot read target offsite: 503".into()),
            mixed: None,
        };
        let text: Vec<String> = lines(&s, 1_795_864_510_000)
            .into_iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        assert_eq!(
            text,
            [
                "Standby: of offsite/db",
                "Holds: db-20261128-101500 (recovery point 2026-11-28T10:15:00Z, 60m ago)",
                "Applying: db-20261128-111500",
                "Checked: 10s ago",
                "Error: cannot read target offsite: 503",
            ]
        );
    }
}
