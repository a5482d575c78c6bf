import NIOConcurrencyHelpers

/// What `SessionKeys.handle(forCookie:)` answered for the cookies seen lately. A cookie names
/// the same session for the life of the keys, so a cookie seen again skips its base64, HMAC and
/// SHA-256 (measured: 8 % of a cached request's CPU, one user on 50 connections).
///
/// Direct-mapped and bounded: each cookie has one slot (its hash under the process's random
/// key), and a newer cookie takes an older one's. A hit compares the whole stored cookie with
/// the one presented, in constant time, so no other value gets a slot's handle however it
/// hashes, and the comparison says nothing of how close a guess came. Only cookies whose tag
/// verified are kept: forged ones cost their HMAC every time, as before.
///
/// Sized for a fleet's instance, not a browser's: 65,536 slots (16 stripes of 4,096). A cookie
/// survives `n` other cookies with probability about e^(−n/65,536): behind a load balancer
/// rotating 10,000 users, 86 % of requests skip the HMAC (with the 8,192 slots before, 30 %).
/// Empty, the slots take about 3 MiB (48 bytes each); full, about 20 MiB (a cookie, its handle's
/// key and its user: ~330 bytes a slot).
final class HandleMemo: Sendable {
    struct Slot {
        let cookie: String
        let handle: SessionHandle
    }

    private static let stripeCount = 16
    private static let slotsPerStripe = 4096
    private let stripes: [NIOLockedValueBox<[Slot?]>]

    init() {
        stripes = (0..<Self.stripeCount).map { _ in NIOLockedValueBox([Slot?](repeating: nil, count: Self.slotsPerStripe)) }
    }

    /// The handle remembered for `cookie` (its bytes: a slice of a received head), else
    /// `compute`'s, remembered when it is one.
    func handle(for cookie: UnsafeRawBufferPointer, _ compute: () -> SessionHandle?) -> SessionHandle? {
        var hasher = Hasher()
        hasher.combine(bytes: cookie)
        let hash = hasher.finalize() & Int.max
        let stripe = stripes[hash & (Self.stripeCount - 1)]
        let index = (hash >> 4) & (Self.slotsPerStripe - 1)
        // (`hash` has 63 random bits: 4 pick the stripe, 12 the slot.)
        if let slot = stripe.withLockedValue({ $0[index] }), Self.equalInConstantTime(slot.cookie, cookie) {
            return slot.handle
        }
        guard let handle = compute() else { return nil }
        let slot = Slot(cookie: String(decoding: cookie, as: UTF8.self), handle: handle)
        stripe.withLockedValue { $0[index] = slot }
        return handle
    }

    /// Every byte compared whatever the first difference (the length is not secret: every
    /// cookie of a kind has the same).
    static func equalInConstantTime(_ stored: String, _ presented: UnsafeRawBufferPointer) -> Bool {
        guard stored.utf8.count == presented.count else { return false }
        func compare(_ kept: UnsafeBufferPointer<UInt8>) -> Bool {
            var difference: UInt8 = 0
            for i in 0..<kept.count { difference |= kept[i] ^ presented[i] }
            return difference == 0
        }
        // A slot's cookie is a native string: contiguous.
        return stored.utf8.withContiguousStorageIfAvailable(compare) ?? Array(stored.utf8).withUnsafeBufferPointer(compare)
    }
}
