//! A [`Fleet`] of sharded replicas with the timings and the catalog the sharding tests share:
//! Leases of [`LEASE_DURATION`], a one-module catalog (`keda`) every SKR must receive, and the
//! checks each of those tests ends with (every Kyma synced, every SKR holding the latest
//! release, one writer per SKR in the audit logs).

use std::ops::{Deref, DerefMut};
use std::time::{Duration, Instant};

use catalogsync::sharding::ring::shard_of;
use catalogsync::sharding::table::Table;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

use super::controlplane::ControlPlane;
use super::fleet::Fleet;
use super::invariants::{InvariantOptions, InvariantReport, check_invariants};
use super::scenario::{MT, mrm, mt};

/// `--lease-duration` of the replicas (see [`Fleet::sharding_args`]).
pub const LEASE_DURATION: Duration = Duration::from_secs(6);
/// `--retry-period` of the replicas: how often a replica renews its member Lease.
pub const RETRY_PERIOD: Duration = Duration::from_secs(1);
/// How long a fleet may take to converge: every shard held, every Kyma synced.
pub const CONVERGE: Duration = Duration::from_secs(60);

/// A fleet whose replicas share `--shards` and whose SKRs are known, for the sharding tests.
pub struct ShardedFleet {
    fleet: Fleet,
    /// `--shards` of every replica.
    pub shards: u32,
    skrs: Vec<&'static ControlPlane>,
    /// How long a catalog change may take to reach every SKR.
    pub prompt: Duration,
}

impl ShardedFleet {
    /// A fleet (namespace prefix `prefix`) of `kymas` Kymas over `skrs`, the catalog
    /// `keda 1.0.0` on channel `regular`, and `--drain-timeout 3s` for every replica.
    ///
    /// # Panics
    /// When the fleet or its catalog cannot be created.
    pub async fn new(
        prefix: &str,
        skrs: &[&'static ControlPlane],
        kymas: usize,
        shards: u32,
        prompt: Duration,
    ) -> Self {
        let mut fleet = Fleet::new(prefix, skrs, kymas).await.expect("create the fleet");
        fleet
            .scenario
            .apply_catalog(&[mt("keda", "1.0.0"), mrm("keda", &[("regular", "1.0.0")])])
            .await
            .expect("catalog");
        fleet.base_args.extend(["--drain-timeout", "3s"].map(str::to_owned));
        Self { fleet, shards, skrs: skrs.to_vec(), prompt }
    }

    /// The sharding flags of this fleet's replicas ([`Fleet::sharding_args`]).
    pub fn args(&self) -> Vec<String> {
        self.fleet.sharding_args(self.shards)
    }

    /// Starts replica `identity` with [`ShardedFleet::args`].
    ///
    /// # Panics
    /// When it cannot be spawned.
    pub fn spawn(&mut self, identity: &str) {
        let args = self.args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.fleet.spawn_replica(identity, &args).expect("spawn replica");
    }

    /// The shard table of the fleet's Leases.
    ///
    /// # Panics
    /// When it cannot be read.
    pub async fn table(&self) -> Table {
        self.fleet.shard_table().await.expect("read the shard table")
    }

    /// Waits until every shard is held, as desired, by one of `replicas`, within the cap.
    pub async fn await_converged(&self, replicas: &[&str]) -> Table {
        self.fleet.await_converged(replicas, self.shards, CONVERGE).await
    }

    /// Waits until every Kyma's condition is `True`/`CatalogSynced`.
    pub async fn await_all_synced(&self) {
        for k in &self.fleet.kymas {
            self.fleet.scenario.await_condition(&k.name, "True", "CatalogSynced", CONVERGE).await;
        }
    }

    /// Waits until every SKR holds the ModuleTemplate `mt_name` in the sync namespace.
    pub async fn await_everywhere(&self, mt_name: &str) {
        for skr in &self.skrs {
            super::await_condition(self.prompt, &format!("{mt_name} in {}", skr.name()), || async {
                self.fleet.scenario.skr_names(skr, MT).await.contains(mt_name)
            })
            .await;
        }
    }

    /// Releases keda `version` on channel `regular` and waits until every SKR holds it;
    /// returns how long that took.
    ///
    /// # Panics
    /// When the catalog cannot be written, or on timeout.
    pub async fn release_everywhere(&self, version: &str) -> Duration {
        let started = Instant::now();
        self.fleet
            .scenario
            .apply_catalog(&[mt("keda", version), mrm("keda", &[("regular", version)])])
            .await
            .expect("catalog change");
        self.await_everywhere(&format!("keda-{version}")).await;
        started.elapsed()
    }

    /// Checks the audit logs so far (Lease history and SKR writes), prints the report and
    /// asserts that no SKR ever had two writers.
    ///
    /// # Panics
    /// When the logs cannot be read, or an SKR had two writers.
    pub fn check(&self, member_liveness: bool) -> InvariantReport {
        let options = InvariantOptions {
            lease_namespace: Some(self.fleet.ns().to_owned()),
            member_liveness,
            ..Default::default()
        };
        let shards = self.shards;
        let report = check_invariants(&self.fleet.invariant_input(|ns, name| shard_of(ns, name, shards), options))
            .expect("invariants");
        eprintln!("{report}");
        report.assert_no_double_writer();
        report
    }

    /// Sum of a metric over `replicas`.
    pub async fn metric_sum(&self, replicas: &[&str], name: &str) -> f64 {
        let mut total = 0.0;
        for r in replicas {
            total += self.fleet.metric(r, name, &[]).await;
        }
        total
    }

    /// The Leases of the fleet's namespace.
    pub fn leases(&self) -> Api<Lease> {
        Api::namespaced(self.fleet.scenario.kcp.clone(), self.fleet.ns())
    }
}

// The sharding tests drive the fleet itself as much as these helpers.
impl Deref for ShardedFleet {
    type Target = Fleet;

    fn deref(&self) -> &Fleet {
        &self.fleet
    }
}

impl DerefMut for ShardedFleet {
    fn deref_mut(&mut self) -> &mut Fleet {
        &mut self.fleet
    }
}
