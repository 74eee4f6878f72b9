use std::sync::Arc;
use receipts::conformance::put;
#[tokio::main]
async fn main() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = receipts::SqliteLedger::open(receipts::SqliteOptions::new(dir.path().join("l.db")), Arc::new(receipts::SystemClock)).await.unwrap();
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(1);
    for round in 0..4 {
        let items: Vec<_> = (0..1000).map(|i| put("d", &format!("{round}-{i}"), &cairn::bench::document(&mut rng, i))).collect();
        let t = std::time::Instant::now();
        let r = receipts::Acceptor::accept(&ledger, items).await;
        if let Some(Err(e)) = r.iter().find(|r| r.is_err()) { panic!("{e:?}"); }
        println!("1000 items: {:?}", t.elapsed());
    }
    let t = std::time::Instant::now();
    for i in 0..100 {
        let r = receipts::Acceptor::accept(&ledger, vec![put("d", &format!("single-{i}"), &cairn::bench::document(&mut rng, i))]).await;
        if let Some(Err(e)) = r.iter().find(|r| r.is_err()) { panic!("{e:?}"); }
    }
    println!("singles: {:?} per item", t.elapsed() / 100);
}
