//! A manager refuses to start on a store of another schema version, with an
//! error naming both versions, and starts again on its own store.

use std::path::Path;
use std::time::Duration;

use redb::{Database, TableDefinition};
use remora_manager::{Config, Manager, ManagerError, SCHEMA_VERSION, StoreError};

const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

fn config(dir: &Path) -> Config {
    Config {
        listen: "127.0.0.1:0".into(),
        data_dir: dir.to_path_buf(),
        heartbeat_timeout: Duration::from_secs(5),
        cluster_key: None,
        tls: None,
        id: 1,
        peers: Default::default(),
        snapshot_every: remora_manager::DEFAULT_SNAPSHOT_EVERY,
        limits: Default::default(),
    }
}

fn set_schema_version(dir: &Path, v: u64) {
    let db = Database::create(dir.join("manager.redb")).unwrap();
    let w = db.begin_write().unwrap();
    w.open_table(META).unwrap().insert("schema_version", v).unwrap();
    w.commit().unwrap();
}

#[test]
fn manager_refuses_a_store_of_another_schema_version() {
    let dir = tempfile::tempdir().unwrap();
    drop(Manager::start(config(dir.path())).expect("fresh store"));
    drop(Manager::start(config(dir.path())).expect("reopened store"));
    set_schema_version(dir.path(), SCHEMA_VERSION + 1);
    match Manager::start(config(dir.path())) {
        Err(ManagerError::Store(e @ StoreError::SchemaMismatch { found, expected, .. })) => {
            assert_eq!(found, SCHEMA_VERSION + 1);
            assert_eq!(expected, SCHEMA_VERSION);
            let msg = e.to_string();
            assert!(msg.contains(&format!("schema version {}", SCHEMA_VERSION + 1)), "{msg}");
            assert!(msg.contains(&format!("reads schema version {SCHEMA_VERSION}")), "{msg}");
        }
        Err(e) => panic!("expected a schema mismatch, got {e}"),
        Ok(_) => panic!("the manager started on a store of another schema version"),
    }
    set_schema_version(dir.path(), SCHEMA_VERSION);
    drop(Manager::start(config(dir.path())).expect("store of this version again"));
}
