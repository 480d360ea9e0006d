//! A minimal NBD client over a raw TCP socket, built on the `hawser_wire::nbd` codecs, for
//! tests that need to send exactly the bytes a real client never would.

use std::net::SocketAddr;

use hawser_wire::nbd::SimpleReply;
use hawser_wire::nbd::{self, Command, InfoRequest, OptionHeader, OptionReply, Request};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One option reply: header and payload.
#[derive(Debug)]
pub struct OptReply {
    pub reply_type: u32,
    pub payload: Vec<u8>,
}

pub struct RawClient {
    pub stream: TcpStream,
}

impl RawClient {
    /// Connect without saying anything.
    pub async fn connect_silent(addr: SocketAddr) -> RawClient {
        RawClient {
            stream: TcpStream::connect(addr).await.expect("connect"),
        }
    }

    /// Connect, check the greeting, and send `client_flags`.
    pub async fn connect(addr: SocketAddr, client_flags: u32) -> RawClient {
        let mut c = RawClient::connect_silent(addr).await;
        let mut greeting = [0u8; nbd::GREETING_LEN];
        c.stream
            .read_exact(&mut greeting)
            .await
            .expect("read greeting");
        assert_eq!(&greeting[0..16], b"NBDMAGICIHAVEOPT");
        let flags = u16::from_be_bytes([greeting[16], greeting[17]]);
        assert_eq!(flags, nbd::FLAG_FIXED_NEWSTYLE | nbd::FLAG_NO_ZEROES);
        c.send(&client_flags.to_be_bytes()).await;
        c
    }

    /// Connect and enter transmission on `name` with NBD_OPT_GO; panics if refused.
    pub async fn connect_go(addr: SocketAddr, name: &str) -> (RawClient, u64) {
        let flags = nbd::CLIENT_FIXED_NEWSTYLE | nbd::CLIENT_NO_ZEROES;
        let mut c = RawClient::connect(addr, flags).await;
        let replies = c.info(nbd::OPT_GO, name, &[]).await;
        let last = replies.last().expect("GO got replies");
        assert_eq!(
            last.reply_type,
            nbd::REP_ACK,
            "GO {name:?} refused: {replies:?}"
        );
        (
            c,
            export_size(&replies).expect("GO reply carries NBD_INFO_EXPORT"),
        )
    }

    pub async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("send");
    }

    pub async fn send_option(&mut self, option: u32, payload: &[u8]) {
        let len = u32::try_from(payload.len()).expect("option payload length");
        let mut msg = OptionHeader { option, len }.encode().to_vec();
        msg.extend_from_slice(payload);
        self.send(&msg).await;
    }

    pub async fn read_option_reply(&mut self) -> (OptionReply, Vec<u8>) {
        let mut header = [0u8; nbd::OPTION_REPLY_HEADER_LEN];
        self.stream
            .read_exact(&mut header)
            .await
            .expect("read option reply");
        let reply = OptionReply::decode(&header).expect("valid option reply");
        let mut payload = vec![0u8; reply.len as usize];
        self.stream
            .read_exact(&mut payload)
            .await
            .expect("read option reply payload");
        (reply, payload)
    }

    /// Send INFO or GO and collect the replies up to the ACK or the first error.
    pub async fn info(&mut self, option: u32, name: &str, infos: &[u16]) -> Vec<OptReply> {
        let payload = InfoRequest {
            name,
            info_types: infos.to_vec(),
        }
        .encode()
        .expect("encode");
        self.send_option(option, &payload).await;
        self.replies_until_done(option).await
    }

    /// Option replies up to and including the ACK or the first error.
    pub async fn replies_until_done(&mut self, option: u32) -> Vec<OptReply> {
        let mut out = Vec::new();
        loop {
            let (header, payload) = self.read_option_reply().await;
            assert_eq!(header.option, option, "reply to the wrong option");
            let done = header.reply_type == nbd::REP_ACK || header.is_error();
            out.push(OptReply {
                reply_type: header.reply_type,
                payload,
            });
            if done {
                return out;
            }
        }
    }

    pub async fn request(
        &mut self,
        command: Command,
        flags: u16,
        handle: u64,
        offset: u64,
        len: u32,
    ) {
        let req = Request {
            flags,
            command,
            handle,
            offset,
            length: len,
        };
        self.send(&req.encode()).await;
    }

    pub async fn write(&mut self, handle: u64, offset: u64, data: &[u8]) {
        let len = u32::try_from(data.len()).expect("write length");
        let mut msg = Request {
            flags: 0,
            command: Command::Write,
            handle,
            offset,
            length: len,
        }
        .encode()
        .to_vec();
        msg.extend_from_slice(data);
        self.send(&msg).await;
    }

    /// Read one simple reply; `data_len` bytes follow it when it reports success.
    pub async fn reply(&mut self, data_len: usize) -> (SimpleReply, Vec<u8>) {
        self.reply_by(|_| data_len).await
    }

    /// Read one simple reply whose data length depends on which request (handle) it answers.
    pub async fn reply_by(&mut self, data_len: impl Fn(u64) -> usize) -> (SimpleReply, Vec<u8>) {
        let mut header = [0u8; nbd::SIMPLE_REPLY_LEN];
        self.stream
            .read_exact(&mut header)
            .await
            .expect("read simple reply");
        let reply = SimpleReply::decode(&header).expect("valid simple reply");
        let data_len = data_len(reply.handle);
        let mut data = Vec::new();
        if reply.error == 0 && data_len > 0 {
            data.resize(data_len, 0);
            self.stream
                .read_exact(&mut data)
                .await
                .expect("read reply data");
        }
        (reply, data)
    }

    /// Whether the server has closed the connection (EOF or reset) without sending more.
    pub async fn closed_by_server(&mut self) -> bool {
        let mut buf = [0u8; 1];
        matches!(self.stream.read(&mut buf).await, Ok(0) | Err(_))
    }
}

/// The export size in the NBD_INFO_EXPORT reply, if there is one.
pub fn export_size(replies: &[OptReply]) -> Option<u64> {
    export_info(replies).map(|(size, _)| size)
}

/// The export's size and transmission flags, from NBD_INFO_EXPORT.
pub fn export_info(replies: &[OptReply]) -> Option<(u64, u16)> {
    replies.iter().find_map(|r| {
        let p = &r.payload;
        let is_export = r.reply_type == nbd::REP_INFO && p.len() == nbd::INFO_EXPORT_LEN;
        (is_export && p[0..2] == nbd::INFO_EXPORT.to_be_bytes()).then(|| {
            let size = u64::from_be_bytes(p[2..10].try_into().expect("8 bytes"));
            (size, u16::from_be_bytes([p[10], p[11]]))
        })
    })
}
