//! Trace and failure text.

use super::*;

impl World {
    pub(super) fn describe_state(&self) -> String {
        let reps: Vec<String> = (0..self.p.replicas)
            .map(|r| {
                let v = self.engine.replica_view(ri(r));
                format!(
                    "r{r}: {:?} connected={} dirty={} store={:?} conn={:?} up={} fault={:?}",
                    v.membership,
                    v.connected,
                    v.dirty_bytes,
                    self.control.store[r],
                    self.drivers[r].conn,
                    self.replicas[r].up,
                    self.replicas[r].fault,
                )
            })
            .collect();
        format!(
            "engine in flight {}, client outstanding {} {:?}, control calls {}; {}",
            self.engine.in_flight(),
            self.client.outstanding(),
            self.client.outstanding_tags(),
            self.control.in_flight,
            reps.join("; ")
        )
    }
}

pub(super) fn describe_op(op: &ClientOp) -> String {
    match op {
        ClientOp::Read { offset, len } => format!("read {offset}+{len}"),
        ClientOp::Write { offset, data, fua } => {
            let v = u64::from_le_bytes(data[0..8].try_into().expect("8 bytes"));
            format!(
                "write v{v} {offset}+{}{}",
                data.len(),
                if *fua { " fua" } else { "" }
            )
        }
        ClientOp::Flush => "flush".into(),
        ClientOp::Trim { offset, len } => format!("trim {offset}+{len}"),
        ClientOp::WriteZeroes {
            offset, len, fua, ..
        } => {
            format!("zeroes {offset}+{len}{}", if *fua { " fua" } else { "" })
        }
    }
}

pub(super) fn describe(ev: &Event) -> String {
    match ev {
        Event::Request {
            r,
            session,
            op: Op::Client(sub, op),
            ..
        } => format!("r{r} <- s{session} sub {sub}: {}", describe_op(op)),
        Event::Reply {
            r,
            session,
            sub,
            result,
        } => {
            let res = match result {
                Ok(Some(d)) => format!("ok {} bytes", d.len()),
                Ok(None) => "ok".into(),
                Err(e) => format!("{e:?}"),
            };
            format!("engine <- r{r} s{session} sub {sub}: {res}")
        }
        other => format!("{other:?}"),
    }
}

pub(super) fn describe_command(c: &Command) -> String {
    match c {
        Command::Send {
            replica,
            sub,
            op,
            background,
        } => format!(
            "send r{} sub {sub}{}: {}",
            replica.0,
            if *background { " (resync)" } else { "" },
            describe_op(op)
        ),
        Command::Complete { tag, result } => match result {
            Ok(_) => format!("complete {tag} ok"),
            Err(e) => format!("complete {tag} {e:?}"),
        },
        other => format!("{other:?}"),
    }
}
