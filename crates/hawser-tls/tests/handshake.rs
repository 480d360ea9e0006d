//! Real TLS handshakes over loopback between configurations of this crate: who gets in,
//! who is refused, and that the server learns whom it serves.

use std::sync::Arc;

use hawser_tls::rustls::pki_types::ServerName;
use hawser_tls::{
    client_config, client_peer, pinned_client_config, server_config, Ca, CertSlot, ClientAuth,
    Credentials, JoinToken, Peer, NODE_CERT_LIFETIME,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

fn creds(ca: &Ca, peer: Peer) -> Credentials {
    let (issued, key_pem) = ca.issue_with_key(&peer, NODE_CERT_LIFETIME).expect("issue");
    Credentials {
        chain_pem: issued.chain_pem,
        key_pem,
    }
}

/// Runs one handshake; the server's view (the client's principal) or the error either side
/// saw.
async fn handshake(
    server: Arc<hawser_tls::rustls::ServerConfig>,
    client: Arc<hawser_tls::rustls::ClientConfig>,
) -> Result<Option<Peer>, String> {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server_side = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.map_err(|e| e.to_string())?;
        let mut tls = TlsAcceptor::from(server)
            .accept(tcp)
            .await
            .map_err(|e| format!("server: {e}"))?;
        let peer = client_peer(tls.get_ref().1.peer_certificates());
        let mut b = [0u8; 1];
        tls.read_exact(&mut b)
            .await
            .map_err(|e| format!("server read: {e}"))?;
        tls.write_all(&b).await.map_err(|e| e.to_string())?;
        Ok::<_, String>(peer)
    });
    let client_side = async {
        let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        let name = ServerName::try_from("anything.invalid").expect("name");
        let mut tls = TlsConnector::from(client)
            .connect(name, tcp)
            .await
            .map_err(|e| format!("client: {e}"))?;
        tls.write_all(b"x")
            .await
            .map_err(|e| format!("client write: {e}"))?;
        let mut b = [0u8; 1];
        tls.read_exact(&mut b)
            .await
            .map_err(|e| format!("client read: {e}"))?;
        Ok::<_, String>(())
    };
    let c = client_side.await;
    let s = server_side.await.expect("server task");
    c?;
    s
}

#[tokio::test]
async fn only_the_expected_peers_of_the_cluster_connect() {
    let ca = Ca::generate("c1").expect("ca");
    let other = Ca::generate("c2").expect("other ca");
    let n1 = CertSlot::new(&creds(&ca, Peer::Node("n1".into()))).expect("n1");
    let n2 = CertSlot::new(&creds(&ca, Peer::Node("n2".into()))).expect("n2");
    let ctl = CertSlot::new(&creds(&ca, Peer::Controller)).expect("controller");
    let foreign = CertSlot::new(&creds(&other, Peer::Node("n2".into()))).expect("foreign");
    let pem = ca.cert_pem();
    let required = server_config(pem, n1.clone(), ClientAuth::Required).expect("server");
    let optional = server_config(pem, ctl.clone(), ClientAuth::Optional).expect("server");
    let to_n1 = |slot: Option<Arc<CertSlot>>| {
        client_config(pem, Peer::Node("n1".into()), slot).expect("client")
    };

    // The peer the server learns is the one the certificate names.
    assert_eq!(
        handshake(required.clone(), to_n1(Some(n2.clone()))).await,
        Ok(Some(Peer::Node("n2".into())))
    );
    assert_eq!(
        handshake(required.clone(), to_n1(Some(ctl.clone()))).await,
        Ok(Some(Peer::Controller))
    );
    // No certificate, or one of another cluster: refused by a server that requires one.
    assert!(handshake(required.clone(), to_n1(None)).await.is_err());
    assert!(handshake(required.clone(), to_n1(Some(foreign.clone())))
        .await
        .is_err());
    // A client that dials n2 does not accept n1, whatever address it used.
    let to_n2 = client_config(pem, Peer::Node("n2".into()), Some(ctl.clone())).expect("client");
    let refused = handshake(required.clone(), to_n2)
        .await
        .expect_err("wrong server");
    assert!(refused.contains("WrongPeer"), "{refused}");
    // A client trusting another CA refuses the server.
    let wrong_ca = client_config(other.cert_pem(), Peer::Node("n1".into()), None).expect("client");
    assert!(handshake(required.clone(), wrong_ca).await.is_err());
    // Optional client authentication: no certificate is fine, a foreign one is not.
    let to_ctl = |slot| client_config(pem, Peer::Controller, slot).expect("client");
    assert_eq!(handshake(optional.clone(), to_ctl(None)).await, Ok(None));
    assert!(handshake(optional.clone(), to_ctl(Some(foreign)))
        .await
        .is_err());
    assert_eq!(
        handshake(optional, to_ctl(Some(n1))).await,
        Ok(Some(Peer::Node("n1".into())))
    );
}

#[tokio::test]
async fn a_joining_node_trusts_only_the_pinned_ca() {
    let ca = Ca::generate("c1").expect("ca");
    let other = Ca::generate("c2").expect("other ca");
    let token = JoinToken::generate(ca.cert_der());
    let ctl = CertSlot::new(&creds(&ca, Peer::Controller)).expect("controller");
    let server = server_config(ca.cert_pem(), ctl, ClientAuth::Optional).expect("server");
    let pinned = pinned_client_config(token.ca_sha256).expect("pinned");
    assert_eq!(handshake(server.clone(), pinned.clone()).await, Ok(None));

    // An impostor with its own CA (presenting it in its chain) is refused, and so is a
    // node of the right cluster posing as the controller.
    let fake = CertSlot::new(&creds(&other, Peer::Controller)).expect("fake");
    let fake = server_config(other.cert_pem(), fake, ClientAuth::Optional).expect("server");
    assert!(handshake(fake, pinned.clone()).await.is_err());
    let node = CertSlot::new(&creds(&ca, Peer::Node("n1".into()))).expect("node");
    let node = server_config(ca.cert_pem(), node, ClientAuth::Optional).expect("server");
    assert!(handshake(node, pinned).await.is_err());
}

#[tokio::test]
async fn a_renewed_certificate_is_used_by_the_next_handshake() {
    let ca = Ca::generate("c1").expect("ca");
    let other = Ca::generate("c2").expect("other");
    let slot = CertSlot::new(&creds(&ca, Peer::Node("n1".into()))).expect("slot");
    let first = slot.not_after_unix();
    assert!(
        slot.replace(&creds(&ca, Peer::Controller)).is_err(),
        "another principal"
    );
    // A certificate of another CA for the same node: accepted by the slot, so the next
    // handshake with a server of the first CA fails: the slot really is read per handshake.
    slot.replace(&creds(&other, Peer::Node("n1".into())))
        .expect("replace");
    let server_slot = CertSlot::new(&creds(&ca, Peer::Controller)).expect("server");
    let server = server_config(ca.cert_pem(), server_slot, ClientAuth::Required).expect("server");
    let client = client_config(ca.cert_pem(), Peer::Controller, Some(slot.clone())).expect("c");
    assert!(handshake(server.clone(), client.clone()).await.is_err());
    slot.replace(&creds(&ca, Peer::Node("n1".into())))
        .expect("replace");
    assert!(slot.not_after_unix() >= first);
    assert_eq!(
        handshake(server, client).await,
        Ok(Some(Peer::Node("n1".into())))
    );
}
