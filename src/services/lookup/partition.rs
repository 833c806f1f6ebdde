//! Where a producer puts a key: Kafka's murmur2 of it, so a lookup reads
//! the key's partition only.

/// The partition a Java producer (and librdkafka's `murmur2_random`)
/// chooses for `key` among `partitions`.
pub fn partition_of(key: &[u8], partitions: usize) -> i32 {
    let positive = u32::from_ne_bytes(murmur2(key).to_ne_bytes()) & 0x7fff_ffff;
    let count = u32::try_from(partitions.max(1)).unwrap_or(u32::MAX);
    i32::try_from(positive % count).unwrap_or(0)
}

/// Kafka's murmur2 (`org.apache.kafka.common.utils.Utils.murmur2`).
fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let length = u32::try_from(data.len()).unwrap_or(u32::MAX);
    let mut h = SEED ^ length;
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    i32::from_ne_bytes(h.to_ne_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Apache Kafka's `UtilsTest.testMurmur2` vectors: a key lands where
    /// every Java producer puts it.
    #[test]
    fn murmur2_is_kafkas() {
        for (data, expected) in [
            (&b"21"[..], -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            (b"abc", 479_470_107),
        ] {
            assert_eq!(murmur2(data), expected, "{}", String::from_utf8_lossy(data));
        }
        assert!((0..6).contains(&partition_of(b"mekari:P-1", 6)));
    }
}
