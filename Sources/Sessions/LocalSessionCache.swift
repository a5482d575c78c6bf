import NIOConcurrencyHelpers
import NIOCore

/// The cache in front of the store: one structure shared by every event loop, split into
/// stripes by session so that loops rarely meet on a lock, and bounded: at `capacity` entries a
/// CLOCK hand picks the least recently used as the victim (an entry looked up since the hand
/// last passed is spared once). A user's sessions are indexed by `sub`, so invalidating a user
/// costs that user's sessions, not the cache. An entry lives at most `ttl`
/// (`store.local_cache_ttl`, the bound on staleness when an invalidation is missed).
///
/// Admission (TinyLFU): while a stripe has room every session is cached. Once it is full, each
/// lookup is counted in the stripe's `FrequencySketch`, and a missed session takes the live
/// victim's place only if it was looked up more often than the victim before this miss
/// (`FrequencySketch.admits`); otherwise it is not cached and the victim stays. So a one-off
/// session never evicts anything, a session that keeps coming back gets in, and a loop over
/// more sessions than the cache holds keeps hitting on most of them instead of evicting, at
/// every miss, the entry the loop will ask for next (measured at 100,000 sessions rotating:
/// every miss paid the store's round trip, an insert and an eviction, slower than no cache). An
/// expired victim, or a free slot (an invalidation, a flush), is taken without asking.
///
/// One shared copy rather than one per event loop: with a replica per loop every session ended
/// up cached on every loop (measured: 340 MiB for 100,000 sessions on 2 loops, slower than no
/// cache), and a full loop was emptied at once.
public final class LocalSessionCache<Value>: Sendable {
    /// A value where the stripe's array of slots only points: the slots stay small (the array
    /// grows by doubling, and a slack slot costs a pointer, not a session). Read and written
    /// under the stripe's lock only.
    @usableFromInline
    final class Box: @unchecked Sendable {
        @usableFromInline var value: Value
        @inlinable init(_ value: Value) { self.value = value }
    }

    @usableFromInline
    struct Slot {
        @usableFromInline var handle: SessionHandle
        @usableFromInline var box: Box
        @usableFromInline var sub: String
        @usableFromInline var expires: NIODeadline
        /// The next slot of the same user (-1: none); `Stripe.firstOfUser` holds the first.
        @usableFromInline var nextOfUser: Int32
        /// Looked up since the CLOCK hand last passed.
        @usableFromInline var referenced: Bool

        @inlinable
        init(handle: SessionHandle, value: Value, sub: String, expires: NIODeadline, nextOfUser: Int32) {
            self.handle = handle
            self.box = Box(value)
            self.sub = sub
            self.expires = expires
            self.nextOfUser = nextOfUser
            self.referenced = false
        }
    }

    /// The stripe's indexes are as small as they can be, since at 100,000 sessions they are a
    /// third of the cache (measured: 216 bytes per session with the handle and the user as keys
    /// and an array per user): sessions are found by their 64-bit fingerprint (the slot's handle
    /// is compared, so a collision is a miss), and a user's sessions are a chain through their
    /// slots.
    @usableFromInline
    final class Stripe: @unchecked Sendable {  // every field under `lock`
        @usableFromInline let lock = NIOLock()
        @usableFromInline var index: [UInt64: Int32] = [:]
        /// Grows up to `capacity`, then is reused: freed slots first, then the CLOCK hand's.
        @usableFromInline var slots: [Slot?] = []
        @usableFromInline var firstOfUser: [String: Int32] = [:]
        @usableFromInline var free: [Int32] = []
        @usableFromInline var hand = 0
        @usableFromInline var evictions = 0
        @usableFromInline let capacity: Int
        /// Lookups counted while the stripe is full (below capacity everything is admitted and
        /// counting would cost every hit for nothing).
        @usableFromInline var sketch: FrequencySketch

        init(capacity: Int) {
            self.capacity = capacity
            self.sketch = FrequencySketch(capacity: capacity)
        }

        @inlinable
        var isFull: Bool { index.count >= capacity }

        /// The slot holding `handle`, if any.
        @inlinable
        func find(_ handle: SessionHandle) -> Int? {
            guard let i = index[LocalSessionCache.fingerprint(handle)].map(Int.init), slots[i]?.handle == handle else { return nil }
            return i
        }

        /// Empties slot `i` (which must hold an entry) and returns it to the free list.
        @usableFromInline
        func remove(at i: Int) {
            guard let slot = slots[i] else { return }
            let key = LocalSessionCache.fingerprint(slot.handle)
            if index[key] == Int32(i) { index[key] = nil }
            // Unlinks `i` from its user's chain.
            if firstOfUser[slot.sub] == Int32(i) {
                firstOfUser[slot.sub] = slot.nextOfUser < 0 ? nil : slot.nextOfUser
            } else {
                var j = Int(firstOfUser[slot.sub] ?? -1)
                while j >= 0, let next = slots[j]?.nextOfUser {
                    if next == Int32(i) {
                        slots[j]!.nextOfUser = slot.nextOfUser
                        break
                    }
                    j = Int(next)
                }
            }
            slots[i] = nil
            free.append(Int32(i))
        }

        /// Puts an entry in slot `i` (empty), first in its user's chain. A session of the same
        /// fingerprint already cached (a 64-bit collision) gives way.
        @usableFromInline
        func insert(_ handle: SessionHandle, sub: String, _ value: Value, expires: NIODeadline, at i: Int) {
            let key = LocalSessionCache.fingerprint(handle)
            if let other = index[key] { remove(at: Int(other)) }
            slots[i] = Slot(handle: handle, value: value, sub: sub, expires: expires, nextOfUser: firstOfUser[sub] ?? -1)
            index[key] = Int32(i)
            firstOfUser[sub] = Int32(i)
        }

        /// A slot for `candidate`: a free one, else the CLOCK hand's pick (expired entries and
        /// those not looked up since the last pass go first), if admission lets the candidate
        /// take a live victim's place. Nil when it does not: the hand stays on the victim, which
        /// the next candidate must beat in turn (as TinyLFU keeps its LRU victim); an idle
        /// victim with a high count holds its place until it expires, its count is halved, or a
        /// candidate is asked for more.
        @usableFromInline
        func claim(for candidate: SessionHandle, now: NIODeadline) -> Int? {
            if let i = free.popLast() { return Int(i) }
            if slots.count < capacity {
                // Doubling, but never past the capacity (a stripe of 6,250 would get 8,192).
                if slots.count == slots.capacity { slots.reserveCapacity(min(capacity, max(16, slots.count * 2))) }
                slots.append(nil)
                return slots.count - 1
            }
            while true {
                let i = hand
                hand = (hand + 1) % slots.count
                guard slots[i] != nil else { return i }
                if slots[i]!.expires > now {  // read in place, as in `get`
                    if slots[i]!.referenced {
                        slots[i]!.referenced = false
                        continue
                    }
                    let (key, victim) = (LocalSessionCache.fingerprint(candidate), LocalSessionCache.fingerprint(slots[i]!.handle))
                    guard sketch.admits(key, over: victim) else {
                        hand = i
                        return nil
                    }
                    evictions += 1
                }
                remove(at: i)
                return Int(free.popLast()!)
            }
        }
    }

    @usableFromInline let stripes: [Stripe]
    public let ttl: TimeAmount
    /// Entries at most, over all stripes.
    public let capacity: Int

    /// - Parameters:
    ///   - ttl: zero disables the cache (every lookup misses).
    ///   - capacity: entries at most (`store.local_cache_entries`); beyond it the least recently
    ///     used go.
    ///   - stripes: how many locks share the entries (a power of two, at most 256).
    public init(ttl: TimeAmount, capacity: Int = 100_000, stripes: Int = 16) {
        precondition(stripes > 0 && stripes <= 256 && stripes & (stripes - 1) == 0, "stripes must be a power of two up to 256")
        let perStripe = max(1, (capacity + stripes - 1) / stripes)
        self.stripes = (0..<stripes).map { _ in Stripe(capacity: perStripe) }
        self.ttl = ttl
        self.capacity = perStripe * stripes
    }

    /// The sketch's key for a handle: its hex digits 2 to 17 as 64 bits (0 and 1 pick the
    /// stripe), uniform as the handle is a SHA-256.
    @inlinable
    static func fingerprint(_ handle: SessionHandle) -> UInt64 {
        var bits: UInt64 = 0
        for digit in handle.key.utf8.dropFirst(2).prefix(16) {
            bits = bits << 4 | UInt64(digit <= 0x39 ? digit &- 0x30 : digit &- 0x57)  // 0-9, a-f
        }
        return bits
    }

    /// The handle's first two hex digits pick its stripe: a handle is a SHA-256, so they are
    /// uniform, and reading them costs nothing beside hashing the whole key once more.
    @inlinable
    func stripe(_ handle: SessionHandle) -> Stripe {
        var digits = handle.key.utf8.makeIterator()
        func value(_ digit: UInt8?) -> Int {
            guard let digit else { return 0 }
            return Int(digit <= 0x39 ? digit &- 0x30 : digit &- 0x57)  // 0-9, a-f (lower-case only)
        }
        let high = value(digits.next())
        return stripes[(high << 4 | value(digits.next())) & (stripes.count - 1)]
    }

    /// The cached value, if fresh.
    @inlinable
    public func get(_ handle: SessionHandle) -> Value? {
        let stripe = stripe(handle)
        return stripe.lock.withLock {
            if stripe.isFull { stripe.sketch.record(Self.fingerprint(handle)) }  // a hit or a miss
            // The slot is read in place: binding it copied the whole entry (every reference in
            // the session and its user retained, then released) before the value was copied out.
            guard let i = stripe.find(handle) else { return nil }
            if stripe.slots[i]!.expires <= .now() {
                stripe.remove(at: i)
                return nil
            }
            if !stripe.slots[i]!.referenced { stripe.slots[i]!.referenced = true }
            return stripe.slots[i]!.box.value
        }
    }

    /// Caches a value for `ttl`, if admitted (always while there is room; a session already
    /// cached is replaced).
    @inlinable
    public func put(_ handle: SessionHandle, sub: String, _ value: Value) {
        guard ttl > .zero else { return }
        let stripe = stripe(handle)
        let now = NIODeadline.now()
        stripe.lock.withLock {
            if let i = stripe.find(handle) { stripe.remove(at: i) }
            guard let i = stripe.claim(for: handle, now: now) else { return }
            stripe.insert(handle, sub: sub, value, expires: now + ttl, at: i)
        }
    }

    /// Replaces a cached value in place, keeping its expiry.
    @inlinable
    public func update(_ handle: SessionHandle, _ body: (inout Value) -> Void) {
        let stripe = stripe(handle)
        stripe.lock.withLock {
            guard let i = stripe.find(handle) else { return }
            body(&stripe.slots[i]!.box.value)
        }
    }

    /// Drops one session.
    public func invalidate(_ handle: SessionHandle) {
        let stripe = stripe(handle)
        stripe.lock.withLock {
            if let i = stripe.find(handle) { stripe.remove(at: i) }
        }
    }

    /// Drops every session of a user: the cost of that user's sessions (and one lookup per
    /// stripe), not of the cache.
    public func invalidate(sub: String) {
        for stripe in stripes {
            stripe.lock.withLock {
                while let i = stripe.firstOfUser[sub] { stripe.remove(at: Int(i)) }
            }
        }
    }

    /// Drops everything (a pub/sub reconnect: invalidations may have been missed).
    public func flush() {
        for stripe in stripes {
            stripe.lock.withLock {
                for i in stripe.slots.indices where stripe.slots[i] != nil { stripe.remove(at: i) }
            }
        }
    }

    /// Entries held now, and live entries evicted for room since the start (for metrics).
    public var statistics: (entries: Int, evictions: Int) {
        stripes.reduce((0, 0)) { total, stripe in
            stripe.lock.withLock { (total.0 + stripe.index.count, total.1 + stripe.evictions) }
        }
    }
}
