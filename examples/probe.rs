use std::sync::Arc;
use receipts::conformance::put;
#[tokio::main]
async fn main() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = receipts::SqliteLedger::open(receipts::SqliteOptions::new(dir.path().join("l.db")), Arc::new(receipts::SystemClock)).await.unwrap();
    let text = "word ".repeat(400);
    for round in 0..3 {
        let items: Vec<_> = (0..1000).map(|i| put("d", &format!("{round}-{i}"), &format!("{i} {round} {text}"))).collect();
        let t = std::time::Instant::now();
        let r = receipts::Acceptor::accept(&ledger, items).await;
        if let Some(Err(e)) = r.iter().find(|r| r.is_err()) { panic!("{e:?}"); }
        println!("1000 items: {:?}", t.elapsed());
    }
}
