//! The simulated cloud's state on disk: one SQLite database under the state
//! directory. Every change is written in one transaction before it becomes
//! visible in memory, so a crash never leaves memory ahead of disk, and a
//! restart on the same directory finds everything as it was.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;

use rusqlite::ErrorCode;

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
    /// The node group that made it, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Until when (ms since the epoch) a node group's new instance is
    /// still being made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_at_ms: Option<u64>,
}

/// A node group as the simulated cloud stores it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeGroupRecord {
    pub cluster: String,
    pub id: String,
    pub min_size: u32,
    pub max_size: u32,
    pub target_size: u32,
    pub instance_type: String,
    /// Zones new instances go to, in turn.
    pub zones: Vec<String>,
    /// Labels and taints (`key`, `value`, `effect`) its nodes carry.
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<(String, String, String)>,
    /// Launches that failed for want of capacity, counted in the target
    /// as an Auto Scaling group's are: tried again once their zone has
    /// capacity, dropped first when the target falls.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed: Vec<FailedLaunch>,
    /// The number the next failed launch's placeholder gets.
    #[serde(default)]
    pub next_failed: u64,
    /// Cluster Autoscaler's options it sets, by name (see
    /// `ccm_provider::node_groups::OPTION_NAMES`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub options: BTreeMap<String, String>,
}

/// A node group's launch that failed: a placeholder with no instance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailedLaunch {
    /// `<group>-failed-<n>`, as its provider ID names it.
    pub id: String,
    pub zone: String,
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

/// A block volume as the simulated cloud stores it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    /// The cloud's ID, `vol-` and 17 hexadecimal digits.
    pub id: String,
    /// The cluster that owns it; no other cluster sees it.
    pub cluster: String,
    /// The name it was created under, unique in its cluster.
    pub name: String,
    /// Its size in bytes, always a whole number of GiB.
    pub size_bytes: i64,
    pub zone: String,
    /// `(instance ID, device name)` pairs, one for each instance it is
    /// attached to.
    pub attachments: Vec<(String, String)>,
    /// The snapshot it was made from, or empty.
    pub source_snapshot_id: String,
    /// The volume it was copied from, or empty.
    pub source_volume_id: String,
    /// What the sim tells of it beyond the above (its `type`).
    pub attributes: BTreeMap<String, String>,
    /// When it was made, in ms since the epoch.
    pub created_at_ms: u64,
    /// Until when (ms since the epoch) an attachment, by instance ID, is
    /// still being made (the `volume_attach_delay` fault).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attaching_until_ms: BTreeMap<String, u64>,
    /// Until when (ms since the epoch) it is still being made (the
    /// `volume_create_delay` fault); 0 when it was made at once.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub creating_until_ms: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A snapshot of a volume as the simulated cloud stores it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    /// The cloud's ID, `snap-` and 17 hexadecimal digits.
    pub id: String,
    /// The cluster that owns it; no other cluster sees it.
    pub cluster: String,
    /// The name it was created under, unique in its cluster.
    pub name: String,
    /// The volume it was taken of (which may be gone since).
    pub source_volume_id: String,
    /// The size of that volume when it was taken, in bytes.
    pub size_bytes: i64,
    /// When it was taken, in ms since the epoch.
    pub created_at_ms: u64,
}

/// What is loaded at open. Instances are not: they are read from the
/// database when asked for, as a cloud keeps them on its own disks, so the
/// process holding the sim does not grow with the cloud's instances
/// (100,000 of them held as records cost about 70 MiB).
#[derive(Debug, Default)]
pub struct Loaded {
    pub load_balancers: Vec<LoadBalancerRecord>,
    pub routes: Vec<RouteRecord>,
    pub volumes: Vec<VolumeRecord>,
    pub snapshots: Vec<SnapshotRecord>,
    pub counters: BTreeMap<String, u64>,
}

/// Everything the store holds, as another process reads it.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub instances: Vec<InstanceRecord>,
    pub load_balancers: Vec<LoadBalancerRecord>,
    pub routes: Vec<RouteRecord>,
    /// Every volume, of every cluster (none in a store written before the
    /// sim had volumes).
    pub volumes: Vec<VolumeRecord>,
    /// Every snapshot of a volume, of every cluster.
    pub volume_snapshots: Vec<SnapshotRecord>,
}

/// The database handle.
pub struct Store {
    db: Connection,
    path: std::path::PathBuf,
    /// Set when a write failed in a way a fresh connection may cure (the
    /// file opened read-only because its directory was, or lost): the next
    /// write opens the database again first.
    reopen: bool,
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
CREATE TABLE IF NOT EXISTS node_groups (
    cluster TEXT NOT NULL, id TEXT NOT NULL, body TEXT NOT NULL,
    PRIMARY KEY (cluster, id));
CREATE TABLE IF NOT EXISTS volumes (
    id TEXT PRIMARY KEY, cluster TEXT NOT NULL, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS snapshots (
    id TEXT PRIMARY KEY, cluster TEXT NOT NULL, body TEXT NOT NULL);
";

/// A failure of the state database. One the disk causes and the disk's
/// recovery ends (full, read-only, failing, busy) is UNAVAILABLE, which
/// callers retry: the write did not happen (SQLite rolled it back, and the
/// sim changes its memory only after the disk), so retrying it once the
/// disk takes writes again loses nothing. Anything else is INTERNAL.
fn db_err(e: rusqlite::Error) -> CloudError {
    let why = match e.sqlite_error_code() {
        Some(ErrorCode::DiskFull) => "the disk is full",
        Some(ErrorCode::ReadOnly) => "its directory is read-only",
        Some(ErrorCode::SystemIoFailure) => "the disk failed to read or write",
        Some(ErrorCode::CannotOpen) => "its file cannot be opened",
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => "it is busy",
        _ => return state_err(e),
    };
    unavailable(why, &e)
}

fn unavailable(why: &str, e: &rusqlite::Error) -> CloudError {
    CloudError::Unavailable(format!(
        "sim state database: {why}, so nothing was changed ({e}); retry once it takes writes again"
    ))
}

/// Any other failure of the sim's state on disk.
fn state_err(e: impl std::fmt::Display) -> CloudError {
    CloudError::Internal(format!("sim state database: {e}"))
}

fn to_json(value: &impl Serialize) -> Result<String> {
    serde_json::to_string(value).map_err(state_err)
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
        out.push(serde_json::from_str(&body.map_err(db_err)?).map_err(state_err)?);
    }
    Ok(out)
}

/// Like [`load_all`], but nothing when `table` does not exist: a store
/// written by a version of the sim that did not have it, opened where it
/// cannot be written or read by another process, which creates nothing.
fn load_all_if_present<T: for<'de> Deserialize<'de>>(
    db: &Connection,
    table: &str,
) -> Result<Vec<T>> {
    let present: bool = db
        .query_row(
            "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1)",
            params![table],
            |row| row.get(0),
        )
        .map_err(db_err)?;
    if present {
        load_all(db, table)
    } else {
        Ok(Vec::new())
    }
}

/// Opens the database at `path`, and whether it could only be opened to
/// read. A database on a read-only filesystem (a volume that came back
/// read-only) is opened to read when it was closed cleanly: its write-ahead
/// log is empty and gone, so the file alone is exact. The sim then answers
/// from what it holds and refuses every write as UNAVAILABLE until the
/// directory takes writes again. One with a log left by a crash cannot be
/// read without writing, and is an error.
fn open_db(path: &Path) -> Result<(Connection, bool)> {
    let writable = Connection::open(path).and_then(|db| {
        db.execute_batch(SCHEMA)?;
        Ok(db)
    });
    let e = match writable {
        Ok(db) => return Ok((db, false)),
        Err(e) => e,
    };
    let log = |suffix: &str| {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        Path::new(&p).exists()
    };
    let cannot_write = matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::CannotOpen | ErrorCode::ReadOnly)
    );
    if !cannot_write || !path.exists() || log("-wal") || log("-shm") {
        return Err(db_err(e));
    }
    let uri = format!(
        "file:{}?immutable=1",
        path.display()
            .to_string()
            .replace('%', "%25")
            .replace('?', "%3f")
            .replace('#', "%23")
    );
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_URI;
    let db = Connection::open_with_flags(uri, flags).map_err(db_err)?;
    tracing::warn!(
        path = %path.display(),
        error = %e,
        "the sim's state cannot be written: serving what it holds, refusing writes until it can"
    );
    Ok((db, true))
}

impl Store {
    /// Opens (or creates) `state.db` in `dir`.
    pub fn open(dir: &Path) -> Result<(Self, Loaded)> {
        std::fs::create_dir_all(dir)
            .map_err(|e| state_err(format!("create {}: {e}", dir.display())))?;
        let path = dir.join("sim-cloud.db");
        let (db, read_only) = open_db(&path)?;
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
        let loaded = Loaded {
            load_balancers: load_all(&db, "load_balancers")?,
            routes: load_all(&db, "routes")?,
            // Opened read-only, a store written before the sim had volumes
            // has no such tables.
            volumes: load_all_if_present(&db, "volumes")?,
            snapshots: load_all_if_present(&db, "snapshots")?,
            counters,
        };
        let store = Self {
            db,
            path,
            reopen: read_only,
        };
        Ok((store, loaded))
    }

    /// What the store in `dir` holds now, read from another process (an
    /// observer that checks the cloud without asking the gateway): the
    /// database is opened without creating anything, and only read.
    pub fn read(dir: &Path) -> Result<Snapshot> {
        let flags =
            rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let db = Connection::open_with_flags(dir.join("sim-cloud.db"), flags).map_err(db_err)?;
        db.busy_timeout(std::time::Duration::from_secs(2))
            .map_err(db_err)?;
        Ok(Snapshot {
            instances: load_all(&db, "instances")?,
            load_balancers: load_all(&db, "load_balancers")?,
            routes: load_all(&db, "routes")?,
            volumes: load_all_if_present(&db, "volumes")?,
            volume_snapshots: load_all_if_present(&db, "snapshots")?,
        })
    }

    /// The instance with `id`.
    pub fn instance(&self, id: &str) -> Result<Option<InstanceRecord>> {
        self.instance_where("id", id)
    }

    /// The instance named `name`.
    pub fn instance_named(&self, name: &str) -> Result<Option<InstanceRecord>> {
        self.instance_where("name", name)
    }

    /// The ID of the instance named `name`.
    pub fn instance_id(&self, name: &str) -> Result<Option<String>> {
        self.db
            .prepare_cached("SELECT id FROM instances WHERE name = ?1")
            .and_then(|mut stmt| stmt.query_row(params![name], |row| row.get(0)).optional())
            .map_err(db_err)
    }

    /// `column` is one of the table's two unique keys.
    fn instance_where(&self, column: &str, value: &str) -> Result<Option<InstanceRecord>> {
        let body: Option<String> = self
            .db
            .prepare_cached(&format!("SELECT body FROM instances WHERE {column} = ?1"))
            .and_then(|mut stmt| stmt.query_row(params![value], |row| row.get(0)).optional())
            .map_err(db_err)?;
        body.map(|body| serde_json::from_str(&body).map_err(state_err))
            .transpose()
    }

    /// Every instance, ordered by ID.
    pub fn instances(&self) -> Result<Vec<InstanceRecord>> {
        let mut out: Vec<InstanceRecord> = load_all(&self.db, "instances")?;
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    /// Runs the write `f` in one transaction, opening the database again
    /// first when an earlier write asked for that.
    fn write(
        &mut self,
        f: impl FnOnce(&rusqlite::Transaction<'_>) -> rusqlite::Result<()>,
    ) -> Result<()> {
        if self.reopen {
            let db = Connection::open(&self.path).and_then(|db| {
                db.execute_batch(SCHEMA)?;
                Ok(db)
            });
            self.db = db.map_err(|e| self.write_err(e))?;
            self.reopen = false;
        }
        let result = self.db.transaction().and_then(|tx| {
            f(&tx)?;
            tx.commit()
        });
        result.map_err(|e| {
            self.reopen = matches!(
                e.sqlite_error_code(),
                Some(ErrorCode::ReadOnly | ErrorCode::CannotOpen | ErrorCode::SystemIoFailure)
            );
            self.write_err(e)
        })
    }

    /// A failed write's error, told more precisely where SQLite says only
    /// that it cannot open or write the file: the filesystem's own answer
    /// to opening it for writing (read-only, full, not permitted).
    fn write_err(&self, e: rusqlite::Error) -> CloudError {
        let vague = matches!(
            e.sqlite_error_code(),
            Some(ErrorCode::ReadOnly | ErrorCode::CannotOpen | ErrorCode::SystemIoFailure)
        );
        let probe = std::fs::OpenOptions::new().append(true).open(&self.path);
        let why = match probe.as_ref().map_err(std::io::Error::kind) {
            Err(std::io::ErrorKind::ReadOnlyFilesystem) if vague => "its directory is read-only",
            Err(std::io::ErrorKind::StorageFull) if vague => "the disk is full",
            Err(std::io::ErrorKind::PermissionDenied) if vague => "its file may not be written",
            _ => return db_err(e),
        };
        unavailable(why, &e)
    }

    /// Stores an instance and the counter that named it.
    pub fn put_instance(
        &mut self,
        record: &InstanceRecord,
        counters: &[(&str, u64)],
    ) -> Result<()> {
        let body = to_json(record)?;
        self.write(|tx| {
            tx.execute(
                "INSERT OR REPLACE INTO instances (id, name, body) VALUES (?1, ?2, ?3)",
                params![record.id, record.name, body],
            )?;
            put_counters(tx, counters)
        })
    }

    /// Every node group, of every cluster.
    pub fn node_groups(&self) -> Result<Vec<NodeGroupRecord>> {
        let mut out: Vec<NodeGroupRecord> = load_all(&self.db, "node_groups")?;
        out.sort_by(|a, b| (&a.cluster, &a.id).cmp(&(&b.cluster, &b.id)));
        Ok(out)
    }

    /// Stores a node group.
    pub fn put_node_group(&mut self, record: &NodeGroupRecord) -> Result<()> {
        let body = to_json(record)?;
        self.write(|tx| {
            tx.execute(
                "INSERT OR REPLACE INTO node_groups (cluster, id, body) VALUES (?1, ?2, ?3)",
                params![record.cluster, record.id, body],
            )
            .map(drop)
        })
    }

    /// Removes an instance, and stores the volumes that were attached to
    /// it as they are now that it is gone.
    pub fn delete_instance(&mut self, id: &str, detached: &[VolumeRecord]) -> Result<()> {
        let bodies = detached
            .iter()
            .map(|v| Ok((v, to_json(v)?)))
            .collect::<Result<Vec<_>>>()?;
        self.write(|tx| {
            tx.execute("DELETE FROM instances WHERE id = ?1", params![id])?;
            for (volume, body) in &bodies {
                tx.execute(
                    "INSERT OR REPLACE INTO volumes (id, cluster, body) VALUES (?1, ?2, ?3)",
                    params![volume.id, volume.cluster, body],
                )?;
            }
            Ok(())
        })
    }

    /// Stores a load balancer, its addresses (replacing any it had), and
    /// the pool cursor.
    pub fn put_load_balancer(
        &mut self,
        record: &LoadBalancerRecord,
        counters: &[(&str, u64)],
    ) -> Result<()> {
        let body = to_json(record)?;
        self.write(|tx| {
            tx.execute(
                "INSERT OR REPLACE INTO load_balancers (cluster, name, body) VALUES (?1, ?2, ?3)",
                params![record.cluster, record.name, body],
            )?;
            tx.execute(
                "DELETE FROM lb_addresses WHERE cluster = ?1 AND lb_name = ?2",
                params![record.cluster, record.name],
            )?;
            for address in &record.addresses {
                tx.execute(
                    "INSERT INTO lb_addresses (address, cluster, lb_name) VALUES (?1, ?2, ?3)",
                    params![address.to_string(), record.cluster, record.name],
                )?;
            }
            put_counters(tx, counters)
        })
    }

    /// Removes a load balancer and releases its addresses.
    pub fn delete_load_balancer(&mut self, cluster: &str, name: &str) -> Result<()> {
        self.write(|tx| {
            tx.execute(
                "DELETE FROM load_balancers WHERE cluster = ?1 AND name = ?2",
                params![cluster, name],
            )?;
            tx.execute(
                "DELETE FROM lb_addresses WHERE cluster = ?1 AND lb_name = ?2",
                params![cluster, name],
            )
            .map(drop)
        })
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
        let body = to_json(record)?;
        self.write(|tx| {
            tx.execute(
                "INSERT OR REPLACE INTO routes (cluster, name, body) VALUES (?1, ?2, ?3)",
                params![record.cluster, record.name, body],
            )
            .map(drop)
        })
    }

    /// Stores a volume, and the counter that named it when it is new.
    pub fn put_volume(&mut self, record: &VolumeRecord, counters: &[(&str, u64)]) -> Result<()> {
        let body = to_json(record)?;
        self.write(|tx| {
            tx.execute(
                "INSERT OR REPLACE INTO volumes (id, cluster, body) VALUES (?1, ?2, ?3)",
                params![record.id, record.cluster, body],
            )?;
            put_counters(tx, counters)
        })
    }

    /// Removes a volume.
    pub fn delete_volume(&mut self, id: &str) -> Result<()> {
        self.write(|tx| {
            tx.execute("DELETE FROM volumes WHERE id = ?1", params![id])
                .map(drop)
        })
    }

    /// Stores a snapshot, and the counter that named it when it is new.
    pub fn put_snapshot(
        &mut self,
        record: &SnapshotRecord,
        counters: &[(&str, u64)],
    ) -> Result<()> {
        let body = to_json(record)?;
        self.write(|tx| {
            tx.execute(
                "INSERT OR REPLACE INTO snapshots (id, cluster, body) VALUES (?1, ?2, ?3)",
                params![record.id, record.cluster, body],
            )?;
            put_counters(tx, counters)
        })
    }

    /// Removes a snapshot.
    pub fn delete_snapshot(&mut self, id: &str) -> Result<()> {
        self.write(|tx| {
            tx.execute("DELETE FROM snapshots WHERE id = ?1", params![id])
                .map(drop)
        })
    }

    /// Removes a route.
    pub fn delete_route(&mut self, cluster: &str, name: &str) -> Result<()> {
        self.write(|tx| {
            tx.execute(
                "DELETE FROM routes WHERE cluster = ?1 AND name = ?2",
                params![cluster, name],
            )
            .map(drop)
        })
    }
}

fn put_counters(tx: &rusqlite::Transaction<'_>, counters: &[(&str, u64)]) -> rusqlite::Result<()> {
    for (name, value) in counters {
        tx.execute(
            "INSERT OR REPLACE INTO counters (name, value) VALUES (?1, ?2)",
            params![name, *value as i64],
        )?;
    }
    Ok(())
}
