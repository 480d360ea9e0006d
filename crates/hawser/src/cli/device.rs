//! `hawser device ...`, run on a node: make a volume attached to this node a kernel block
//! device (`/dev/nbdN`) served by the agent itself, so it outlives an agent restart or
//! upgrade; list and end such devices. Talks to the agent's device API on its unix socket.

use std::path::PathBuf;

use clap::Subcommand;
use hawser_api::device_client::DeviceClient;

use crate::cli::output::{print_json, Format, OutputArg, Table};

#[derive(Debug, Subcommand)]
pub enum DeviceCmd {
    /// Make a volume attached to this node a kernel block device, and print its path.
    Attach {
        volume: String,
        /// auto (the best this kernel has), ublk or nbd.
        #[arg(long, default_value = "auto")]
        frontend: String,
        /// A ublk device's queues, in place of the agent's --ublk-queues.
        #[arg(long, value_name = "N")]
        ublk_queues: Option<u16>,
        /// A ublk device's queue depth, in place of the agent's --ublk-queue-depth.
        #[arg(long, value_name = "N")]
        ublk_queue_depth: Option<u16>,
        #[command(flatten)]
        socket: SocketArg,
        #[command(flatten)]
        out: OutputArg,
    },
    /// End a volume's kernel block device (unmount it first: pending I/O fails).
    Detach {
        volume: String,
        #[command(flatten)]
        socket: SocketArg,
    },
    /// The kernel block devices this node's agent serves.
    List {
        #[command(flatten)]
        socket: SocketArg,
        #[command(flatten)]
        out: OutputArg,
    },
}

#[derive(Debug, clap::Args)]
pub struct SocketArg {
    /// The agent's device API socket [default: <data-dir>/device.sock].
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// The agent's --data-dir, to find its socket.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/hawser")]
    data_dir: PathBuf,
}

impl SocketArg {
    fn client(&self) -> DeviceClient {
        let path = self
            .socket
            .clone()
            .unwrap_or_else(|| self.data_dir.join("device.sock"));
        DeviceClient::new(&path)
    }
}

pub fn run(cmd: DeviceCmd) -> anyhow::Result<()> {
    match cmd {
        DeviceCmd::Attach {
            volume,
            frontend,
            ublk_queues,
            ublk_queue_depth,
            socket,
            out,
        } => {
            let d = socket
                .client()
                .attach_with(&hawser_api::agent::AttachDevice {
                    volume,
                    frontend,
                    ublk_queues,
                    ublk_queue_depth,
                })?;
            match out.format {
                Format::Json => print_json(&d),
                Format::Table => println!("{}", d.path),
            }
        }
        DeviceCmd::Detach { volume, socket } => socket.client().detach(&volume)?,
        DeviceCmd::List { socket, out } => {
            let all = socket.client().list()?;
            if out.format == Format::Json {
                print_json(&all);
                return Ok(());
            }
            let mut t = Table::new(&["VOLUME", "FRONTEND", "DEVICE", "SIZE"]);
            for d in all {
                t.row(vec![
                    d.volume,
                    d.frontend,
                    d.path,
                    hawser_api::format_size(d.size_bytes),
                ]);
            }
            t.print();
        }
    }
    Ok(())
}
