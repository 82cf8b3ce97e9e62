//! The cluster map's decoder (`onekv_placement::ClusterMap::decode`) on arbitrary bytes: a node
//! reads it from its data directory and a client from any node's Status. It may not panic, and
//! whatever it accepts must be a valid map that encodes back to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use onekv_placement::ClusterMap;

fuzz_target!(|data: &[u8]| {
    if let Ok(map) = ClusterMap::decode(data) {
        assert!(map.validate().is_ok());
        assert_eq!(map.encode(), data);
        for shard in &map.shards {
            assert_eq!(map.shard(shard.id), Some(shard));
        }
    }
});
