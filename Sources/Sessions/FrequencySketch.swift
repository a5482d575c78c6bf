/// How often each key was looked up lately, approximately and in a fixed space: the admission
/// policy of `LocalSessionCache` (TinyLFU's). A count-min sketch: a key is counted in four 4-bit
/// counters (saturating at 15) and its estimate is the least of them, so a collision can only
/// over-count. Every `sampleSize` records all counters are halved, so that what was popular long
/// ago fades.
///
/// A pure value (no lock, no clock, no allocation after `init`): the cache keeps one per stripe,
/// under the stripe's lock. Keys are 64 uniform bits (the cache takes them from the session
/// handle, a SHA-256).
@usableFromInline
struct FrequencySketch: Sendable {
    /// Sixteen 4-bit counters per word.
    @usableFromInline var words: [UInt64]
    /// log2 of the number of counters.
    @usableFromInline let counterBits: Int
    /// Records since the last halving.
    @usableFromInline var records = 0
    /// Records between halvings: ten per entry of the cache served (TinyLFU's sample size).
    @usableFromInline let sampleSize: Int

    /// - Parameter capacity: entries of the cache served; the sketch takes one word (16
    ///   counters, 8 bytes) per entry, rounded up to a power of two.
    init(capacity: Int) {
        let entries = max(capacity, 8)
        let wordCount = 1 << (Int.bitWidth - (entries - 1).leadingZeroBitCount)
        words = Array(repeating: 0, count: wordCount)
        counterBits = wordCount.trailingZeroBitCount + 4
        sampleSize = 10 * entries
    }

    /// The word and bit offset of `key`'s counter in row `row` (0..<4): the top bits of the key
    /// times a row's odd constant (multiplicative hashing; one constant per row, unrelated, so
    /// that keys colliding in one row rarely collide in another).
    @inlinable
    func counter(_ key: UInt64, row: Int) -> (word: Int, shift: UInt64) {
        let multiplier: UInt64
        switch row {
        case 0: multiplier = 0x9E37_79B9_7F4A_7C15
        case 1: multiplier = 0xBF58_476D_1CE4_E5B9
        case 2: multiplier = 0x94D0_49BB_1331_11EB
        default: multiplier = 0xFF51_AFD7_ED55_8CCD
        }
        let index = Int(truncatingIfNeeded: ((key ^ (key >> 32)) &* multiplier) >> UInt64(64 - counterBits))
        return (index >> 4, UInt64(index & 15) << 2)
    }

    /// Counts one lookup of `key`.
    @inlinable
    mutating func record(_ key: UInt64) {
        for row in 0..<4 {
            let (word, shift) = counter(key, row: row)
            if (words[word] >> shift) & 0xF < 0xF { words[word] &+= 1 << shift }
        }
        records += 1
        if records >= sampleSize { halve() }
    }

    /// Lookups of `key` counted (an over-estimate when it shares all four counters), 0...15.
    @inlinable
    func estimate(_ key: UInt64) -> Int {
        var least = UInt64(0xF)
        for row in 0..<4 {
            let (word, shift) = counter(key, row: row)
            least = min(least, (words[word] >> shift) & 0xF)
        }
        return Int(least)
    }

    /// Whether a full cache should take `candidate`, which just missed, in place of `victim`:
    /// only if the candidate was looked up more often than the victim *before* this lookup.
    /// The candidate's count includes the miss itself, hence the `+ 1`: without it, in a loop
    /// over more keys than the cache holds every candidate is one lookup ahead of the entries
    /// the loop has not reached yet, and each miss would evict an entry about to be asked for.
    /// A key looked up once (a one-off) is never admitted in place of a live entry.
    @inlinable
    func admits(_ candidate: UInt64, over victim: UInt64) -> Bool {
        estimate(candidate) > estimate(victim) + 1
    }

    /// Halves every counter (TinyLFU's reset): old counts fade, the order of counts is kept.
    @usableFromInline
    mutating func halve() {
        for i in words.indices { words[i] = (words[i] >> 1) & 0x7777_7777_7777_7777 }
        records /= 2
    }
}
