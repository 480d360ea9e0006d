//! An encrypted volume (issue 21, encryption at rest) through its engine, without the control
//! plane: one local and one remote replica. What the client writes reads back as written;
//! neither replica's file holds any of it in the clear, and both hold the same ciphertext; a
//! zeroing reads back as zeros; a new engine (another epoch, as after a move) with the same
//! key reads the data, and one with another key, or none, is refused by the replicas' key
//! check before it touches anything.

use bytes::Bytes;
use hawser_agent::engine::rate_limit::ResyncRates;
use hawser_agent::frontends::block::ExportRegistry;
use hawser_api::Secret;

const SIZE: u64 = 64 << 20;
const MARKER: &[u8] = b"HAWSER-KNOWN-PLAINTEXT-";

fn key(seed: u8) -> Secret {
    Secret::new(
        &(0..64u8)
            .map(|i| i.wrapping_mul(7) ^ seed)
            .collect::<Vec<u8>>(),
    )
}

/// 64 KiB of the marker, repeated.
fn plaintext(len: usize) -> Bytes {
    MARKER
        .iter()
        .copied()
        .cycle()
        .take(len)
        .collect::<Vec<u8>>()
        .into()
}

fn holds(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encrypted_volume_stores_only_ciphertext_and_reads_back_with_its_key() {
    let t = crate::node_support::two_nodes_with("encrypted", SIZE, Some(key(1))).await;
    let dev = t.engines.lookup("vol").expect("the export");
    let data = plaintext(64 << 10);
    // Sector-aligned but not 4 KiB-aligned places too.
    for offset in [0u64, 512, 5 << 20, SIZE - (64 << 10)] {
        dev.write(offset, data.clone(), false).await.expect("write");
        assert_eq!(dev.read(offset, 64 << 10).await.expect("read"), data);
    }
    dev.write_zeroes(1 << 20, 3 << 20, false, true)
        .await
        .expect("zero");
    let zeros = dev.read(1 << 20, 3 << 20).await.expect("read zeros");
    assert!(
        zeros.iter().all(|b| *b == 0),
        "a zeroing reads back as zeros"
    );
    dev.flush().await.expect("flush");

    let a = std::fs::read(t.a.replica("vol-a").expect("a").data_path()).expect("read a");
    let b = std::fs::read(t.b.replica("vol-b").expect("b").data_path()).expect("read b");
    assert!(
        !holds(&a, MARKER) && !holds(&b, MARKER),
        "plaintext in a replica file"
    );
    assert_eq!(a, b, "the replicas hold the same ciphertext");
    assert!(
        !a[1 << 20..4 << 20].iter().all(|b| *b == 0),
        "zeros are stored encrypted"
    );

    // A new engine, in a later epoch: with the volume's key it reads the data; another key,
    // or none, is refused by the local replica's key check before the running engine stops.
    let mut req = t.req.clone();
    req.epoch = 2;
    let start = |req: hawser_api::agent::StartEngine| {
        let (engines, a) = (t.engines.clone(), t.a.clone());
        async move {
            engines
                .start(&req, "a", &a, ResyncRates::default(), &Default::default())
                .await
        }
    };
    start(req.clone()).await.expect("start the next engine");
    assert_eq!(dev.read(5 << 20, 64 << 10).await.expect("read"), data);
    for (wrong, why) in [(Some(key(2)), "another key"), (None, "no key")] {
        req.epoch += 1;
        req.data_key = wrong;
        let e = start(req.clone()).await.err().expect(why).to_string();
        assert!(
            e.contains("not the key this replica's data is encrypted with"),
            "{e}"
        );
        assert_eq!(
            dev.read(5 << 20, 64 << 10).await.expect("read"),
            data,
            "the running engine serves on after a refused start with {why}"
        );
        assert_eq!(t.a.replica("vol-a").expect("a").epoch(), 2, "{why}");
    }
    let _ = t.stop.send(true);
}
