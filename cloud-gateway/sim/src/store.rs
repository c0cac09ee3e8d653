//! The simulated cloud's state on disk: one SQLite database under the state
//! directory. Every change is written in one transaction before it becomes
//! visible in memory, so a crash never leaves memory ahead of disk, and a
//! restart on the same directory finds everything as it was.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;

use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};

use ccm_provider::{CloudError, Result};

/// An instance as the simulated cloud stores it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InstanceRecord {
    pub id: String,
    pub name: String,
    pub instance_type: String,
    pub zone: String,
    pub region: String,
    pub running: bool,
    /// `(NodeAddressType name, address)` pairs.
    pub addresses: Vec<(String, String)>,
    pub labels: BTreeMap<String, String>,
}

/// A load balancer as the simulated cloud stores it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoadBalancerRecord {
    pub cluster: String,
    pub name: String,
    pub service_namespace: String,
    pub service_name: String,
    pub service_uid: String,
    pub addresses: Vec<IpAddr>,
    pub internal: bool,
    pub algorithm: String,
    pub health_check_interval_ms: u64,
    /// `(port, protocol name, node port)` triples.
    pub ports: Vec<(i32, String, i32)>,
    pub source_ranges: Vec<String>,
    pub hosts: Vec<String>,
    /// Unix time in ms when provisioning completes.
    pub ready_at_ms: u64,
}

/// A route as the simulated cloud stores it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RouteRecord {
    pub cluster: String,
    pub name: String,
    pub target_node: String,
    pub destination_cidr: String,
    pub target_addresses: Vec<(String, String)>,
}

/// Everything loaded at open.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub instances: Vec<InstanceRecord>,
    pub load_balancers: Vec<LoadBalancerRecord>,
    pub routes: Vec<RouteRecord>,
    pub counters: BTreeMap<String, u64>,
}

/// The database handle.
pub struct Store {
    db: Connection,
}

const SCHEMA: &str = "
PRAGMA journal_mode = WAL;
PRAGMA synchronous = NORMAL;
CREATE TABLE IF NOT EXISTS instances (
    id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS load_balancers (
    cluster TEXT NOT NULL, name TEXT NOT NULL, body TEXT NOT NULL,
    PRIMARY KEY (cluster, name));
-- One row per address in use: the primary key makes handing out an
-- address twice impossible, whatever the code above does.
CREATE TABLE IF NOT EXISTS lb_addresses (
    address TEXT PRIMARY KEY, cluster TEXT NOT NULL, lb_name TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS routes (
    cluster TEXT NOT NULL, name TEXT NOT NULL, body TEXT NOT NULL,
    PRIMARY KEY (cluster, name));
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
";

fn db_err(e: impl std::fmt::Display) -> CloudError {
    CloudError::Internal(format!("sim state database: {e}"))
}

fn to_json(value: &impl Serialize) -> Result<String> {
    serde_json::to_string(value).map_err(db_err)
}

fn load_all<T: for<'de> Deserialize<'de>>(db: &Connection, table: &str) -> Result<Vec<T>> {
    let mut stmt = db
        .prepare(&format!("SELECT body FROM {table}"))
        .map_err(db_err)?;
    let rows = stmt
        .query_map([], |row| row.get::<_, String>(0))
        .map_err(db_err)?;
    let mut out = Vec::new();
    for body in rows {
        out.push(serde_json::from_str(&body.map_err(db_err)?).map_err(db_err)?);
    }
    Ok(out)
}

impl Store {
    /// Opens (or creates) `state.db` in `dir`.
    pub fn open(dir: &Path) -> Result<(Self, Snapshot)> {
        std::fs::create_dir_all(dir)
            .map_err(|e| db_err(format!("create {}: {e}", dir.display())))?;
        let db = Connection::open(dir.join("sim-cloud.db")).map_err(db_err)?;
        db.execute_batch(SCHEMA).map_err(db_err)?;
        let mut counters = BTreeMap::new();
        {
            let mut stmt = db
                .prepare("SELECT name, value FROM counters")
                .map_err(db_err)?;
            let rows = stmt
                .query_map([], |row| {
                    Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?))
                })
                .map_err(db_err)?;
            for row in rows {
                let (name, value) = row.map_err(db_err)?;
                counters.insert(name, value as u64);
            }
        }
        let snapshot = Snapshot {
            instances: load_all(&db, "instances")?,
            load_balancers: load_all(&db, "load_balancers")?,
            routes: load_all(&db, "routes")?,
            counters,
        };
        Ok((Self { db }, snapshot))
    }

    /// Stores an instance and the counter that named it.
    pub fn put_instance(
        &mut self,
        record: &InstanceRecord,
        counters: &[(&str, u64)],
    ) -> Result<()> {
        let tx = self.db.transaction().map_err(db_err)?;
        tx.execute(
            "INSERT OR REPLACE INTO instances (id, name, body) VALUES (?1, ?2, ?3)",
            params![record.id, record.name, to_json(record)?],
        )
        .map_err(db_err)?;
        for (name, value) in counters {
            put_counter(&tx, name, *value)?;
        }
        tx.commit().map_err(db_err)
    }

    /// Removes an instance.
    pub fn delete_instance(&mut self, id: &str) -> Result<()> {
        self.db
            .execute("DELETE FROM instances WHERE id = ?1", params![id])
            .map(drop)
            .map_err(db_err)
    }

    /// Stores a load balancer, its addresses (replacing any it had), and
    /// the pool cursor.
    pub fn put_load_balancer(
        &mut self,
        record: &LoadBalancerRecord,
        counters: &[(&str, u64)],
    ) -> Result<()> {
        let tx = self.db.transaction().map_err(db_err)?;
        tx.execute(
            "INSERT OR REPLACE INTO load_balancers (cluster, name, body) VALUES (?1, ?2, ?3)",
            params![record.cluster, record.name, to_json(record)?],
        )
        .map_err(db_err)?;
        tx.execute(
            "DELETE FROM lb_addresses WHERE cluster = ?1 AND lb_name = ?2",
            params![record.cluster, record.name],
        )
        .map_err(db_err)?;
        for address in &record.addresses {
            tx.execute(
                "INSERT INTO lb_addresses (address, cluster, lb_name) VALUES (?1, ?2, ?3)",
                params![address.to_string(), record.cluster, record.name],
            )
            .map_err(db_err)?;
        }
        for (name, value) in counters {
            put_counter(&tx, name, *value)?;
        }
        tx.commit().map_err(db_err)
    }

    /// Removes a load balancer and releases its addresses.
    pub fn delete_load_balancer(&mut self, cluster: &str, name: &str) -> Result<()> {
        let tx = self.db.transaction().map_err(db_err)?;
        tx.execute(
            "DELETE FROM load_balancers WHERE cluster = ?1 AND name = ?2",
            params![cluster, name],
        )
        .map_err(db_err)?;
        tx.execute(
            "DELETE FROM lb_addresses WHERE cluster = ?1 AND lb_name = ?2",
            params![cluster, name],
        )
        .map_err(db_err)?;
        tx.commit().map_err(db_err)
    }

    /// Which load balancer holds `address`, per the database.
    pub fn address_owner(&self, address: IpAddr) -> Result<Option<(String, String)>> {
        self.db
            .query_row(
                "SELECT cluster, lb_name FROM lb_addresses WHERE address = ?1",
                params![address.to_string()],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .optional()
            .map_err(db_err)
    }

    /// Stores a route.
    pub fn put_route(&mut self, record: &RouteRecord) -> Result<()> {
        self.db
            .execute(
                "INSERT OR REPLACE INTO routes (cluster, name, body) VALUES (?1, ?2, ?3)",
                params![record.cluster, record.name, to_json(record)?],
            )
            .map(drop)
            .map_err(db_err)
    }

    /// Removes a route.
    pub fn delete_route(&mut self, cluster: &str, name: &str) -> Result<()> {
        self.db
            .execute(
                "DELETE FROM routes WHERE cluster = ?1 AND name = ?2",
                params![cluster, name],
            )
            .map(drop)
            .map_err(db_err)
    }
}

fn put_counter(tx: &rusqlite::Transaction<'_>, name: &str, value: u64) -> Result<()> {
    tx.execute(
        "INSERT OR REPLACE INTO counters (name, value) VALUES (?1, ?2)",
        params![name, value as i64],
    )
    .map(drop)
    .map_err(db_err)
}
