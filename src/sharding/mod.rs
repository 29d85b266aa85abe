//! Which Kymas this replica may sync. This is the one filter the sync path asks; sharding
//! plugs in here (Leases, consistent hashing, handover).

pub mod view;

pub use view::ShardView;
