//! An engine of another volume under the same name (the old one deleted, a new one created)
//! is never swapped in under the old one's clients: the old export ends (its requests fail)
//! and the namesake gets an export of its own. An engine of the same volume in a newer epoch
//! is swapped in under the same export, as before.

use std::sync::Arc;

use hawser_agent::engine::rate_limit::ResyncRates;
use hawser_agent::frontends::block::ExportRegistry;

use crate::node_support::two_nodes;

const U1: &str = "11111111111111111111111111111111";
const U2: &str = "22222222222222222222222222222222";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namesake_engine_gets_an_export_of_its_own_and_the_old_one_ends() {
    let t = two_nodes("engine-namesake", 8 << 20).await;
    let start = |uid: &str, epoch: u64| {
        let mut req = t.req.clone();
        req.uid = Some(uid.into());
        req.epoch = epoch;
        let (engines, a) = (t.engines.clone(), t.a.clone());
        async move {
            engines
                .start(&req, "a", &a, ResyncRates::default(), &Default::default())
                .await
                .expect("start engine")
        }
    };
    let identified = |want: &str| {
        let (d, id) = t.engines.lookup_identified("vol").expect("an export");
        assert_eq!(id.uid.as_deref(), Some(want));
        d
    };
    // A volume without a uid (two_nodes starts one) is not the volume of uid U1 either.
    let (legacy, _) = t.engines.lookup_identified("vol").expect("an export");
    start(U1, 2).await;
    assert!(legacy.read(0, 4096).await.is_err(), "the old export ended");
    let first = identified(U1);
    first
        .write(0, bytes::Bytes::from(vec![0xa1; 4096]), true)
        .await
        .expect("write");
    // The same volume in a newer epoch: swapped in under the same export.
    start(U1, 3).await;
    let same = identified(U1);
    assert!(Arc::ptr_eq(&first, &same), "the same export");
    assert_eq!(
        t.engines.lookup_identified("vol").expect("export").1.epoch,
        3
    );
    assert_eq!(first.read(0, 4096).await.expect("read")[..], [0xa1; 4096]);
    // A namesake: the first volume's export (and anything holding it) gets errors.
    start(U2, 4).await;
    let namesake = identified(U2);
    assert!(!Arc::ptr_eq(&first, &namesake), "an export of its own");
    assert!(first.read(0, 4096).await.is_err(), "the old export ended");
    assert!(first
        .write(0, bytes::Bytes::from(vec![0xb2; 4096]), true)
        .await
        .is_err());
    assert_eq!(namesake.size(), 8 << 20);
    assert!(t.engines.stop("vol").await);
    let _ = t.stop.send(true);
}
