import Crypto
import NIOCore
import NIOPosix
@testable import Sessions
import Testing

@Suite("Session keys and cookies")
struct SessionKeysTests {
    let keys = try! SessionKeys(secret: Array("0123456789abcdef0123456789abcdef-test".utf8))

    @Test("a cookie names its session and its user, and no two sessions share an id")
    func cookieRoundTripAndUniqueness() throws {
        let (cookie, handle) = keys.newSession(for: "000123.abc.0456")
        #expect(cookie.utf8.count == SessionKeys.cookieLength + 1 + 20)
        let read = try #require(keys.handle(forCookie: Substring(cookie)))
        #expect(read == handle)
        #expect(read.sub == "000123.abc.0456")
        #expect(handle.key.utf8.count == 64)
        let ids = Set((0..<1000).map { _ in keys.newSession(for: "u").handle })
        #expect(ids.count == 1000)
    }

    @Test("a cookie from before the user was part of it still names its session, without a user")
    func cookiesWithoutTheUserStillWork() throws {
        let (cookie, handle) = keys.legacySession()
        #expect(cookie.utf8.count == SessionKeys.cookieLength)
        let read = try #require(keys.handle(forCookie: Substring(cookie)))
        #expect(read == handle)
        #expect(read.sub == nil)
    }

    @Test("a cookie whose user is changed, dropped or added does not verify")
    func theUserIsSigned() throws {
        let (cookie, _) = keys.newSession(for: "user.a")
        let signed = cookie.prefix(SessionKeys.cookieLength)
        #expect(keys.handle(forCookie: signed + "." + Base64URL.encode(Array("user.b".utf8))) == nil, "another user")
        #expect(keys.handle(forCookie: signed) == nil, "the user dropped")
        #expect(keys.handle(forCookie: signed + ".") == nil, "an empty user")
        #expect(keys.handle(forCookie: signed + "!" + cookie.dropFirst(SessionKeys.cookieLength + 1)) == nil, "not a dot")
        let (legacy, _) = keys.legacySession()
        #expect(keys.handle(forCookie: Substring(legacy + "." + Base64URL.encode(Array("user.a".utf8)))) == nil, "a user added to a cookie without one")
        #expect(keys.handle(forCookie: signed + "." + String(repeating: "A", count: 400)) == nil, "a user longer than any")
        // A user that is not UTF-8, signed with our key: still refused.
        let id = Array(repeating: UInt8(1), count: 32)
        let badUser: [UInt8] = [0xff, 0xfe]
        #expect(keys.handle(forCookie: Substring(Base64URL.encode(id + Array(keys.tag(id, sub: badUser))) + "." + Base64URL.encode(badUser))) == nil)
    }

    /// `cookie` with one character changed, at each position in turn.
    static func oneCharacterOff(_ cookie: String) -> [(Int, String)] {
        let bytes = Array(cookie.utf8)
        return bytes.indices.map { i in
            var changed = bytes
            changed[i] = bytes[i] == UInt8(ascii: "A") ? UInt8(ascii: "B") : UInt8(ascii: "A")
            return (i, String(decoding: changed, as: UTF8.self))
        }
    }

    @Test func forgedCookiesAreRejected() throws {
        let (cookie, _) = keys.newSession(for: "user.a")
        // Single-character changes, in the id, the tag and the user.
        for (i, changed) in Self.oneCharacterOff(cookie) where i % 3 == 0 {
            #expect(keys.handle(forCookie: Substring(changed)) == nil, "position \(i)")
        }
        #expect(keys.handle(forCookie: Substring(cookie.dropLast())) == nil)
        #expect(keys.handle(forCookie: Substring(cookie + "A")) == nil)
        #expect(keys.handle(forCookie: "") == nil)
        #expect(keys.handle(forCookie: Substring(String(repeating: "A", count: SessionKeys.cookieLength))) == nil)
        #expect(keys.handle(forCookie: Substring(String(repeating: "=", count: SessionKeys.cookieLength))) == nil)
        // The same cookie under another secret.
        let other = try SessionKeys(secret: Array("another-secret-another-secret-another".utf8))
        #expect(other.handle(forCookie: Substring(cookie)) == nil)
    }

    @Test("a cookie seen before is answered from the memo exactly as verified; a cookie one character off never gets its handle")
    func memoizedHandles() throws {
        let (cookie, handle) = keys.newSession(for: "user.memo")
        #expect(keys.handle(forCookie: Substring(cookie)) == handle)
        #expect(keys.handle(forCookie: Substring(cookie)) == handle, "again, from the memo")
        for (i, changed) in Self.oneCharacterOff(cookie) {
            #expect(keys.handle(forCookie: Substring(changed)) == nil, "position \(i)")
        }
        #expect(keys.handle(forCookie: Substring(cookie.dropLast())) == nil)
        #expect(keys.handle(forCookie: Substring(cookie + "A")) == nil)
        // More cookies than the memo has slots: each still names its own session.
        let many = (0..<20_000).map { _ in keys.newSession(for: "u\(Int.random(in: 0..<100))") }
        for (cookie, handle) in many { #expect(keys.handle(forCookie: Substring(cookie)) == handle) }
        for (cookie, handle) in many.shuffled().prefix(2_000) {
            #expect(keys.handle(forCookie: Substring(cookie)) == handle)
            #expect(keys.verifiedHandle(forCookie: Substring(cookie)) == handle)
        }
    }

    @Test("behind a load balancer, most of 10,000 rotating cookies are still remembered when they come back")
    func memoHoldsAFleetsRotation() {
        let memo = HandleMemo()
        let cookies = (0..<10_000).map { _ in keys.newSession(for: "u") }
        var computed = 0
        for _ in 0..<2 {
            for (cookie, handle) in cookies {
                _ = Array(cookie.utf8).withUnsafeBytes { bytes in memo.handle(for: bytes) { computed += 1; return handle } }
            }
        }
        // 10,000 the first time; the second, each cookie whose slot another took (~14 % at
        // 65,536 slots; ~70 % at the 8,192 there were).
        #expect(computed - 10_000 < 2_500, "\(computed - 10_000) of 10,000 recomputed")
    }

    @Test("the memo asks once per cookie, keeps only handles, and compares whole values")
    func handleMemo() {
        let memo = HandleMemo()
        let (cookie, handle) = keys.newSession(for: "u")
        var computed = 0
        func ask(_ text: String, _ answer: SessionHandle?) -> SessionHandle? {
            Array(text.utf8).withUnsafeBytes { bytes in memo.handle(for: bytes) { computed += 1; return answer } }
        }
        #expect(ask(cookie, handle) == handle)
        #expect(ask(cookie, nil) == handle, "remembered")
        #expect(computed == 1)
        #expect(ask(String(cookie.dropLast()), nil) == nil, "a prefix is another cookie")
        #expect(ask("forged", nil) == nil)
        #expect(ask("forged", nil) == nil)
        #expect(computed == 4, "a refusal is not remembered")
        func equal(_ a: String, _ b: String) -> Bool { Array(b.utf8).withUnsafeBytes { HandleMemo.equalInConstantTime(a, $0) } }
        #expect(equal("abc", "abc"))
        #expect(!equal("abc", "abd"))
        #expect(!equal("abc", "abcd"))
    }

    @Test func refreshTokensAreSealedToTheirSession() {
        let (_, a) = keys.newSession(for: "u")
        let (_, b) = keys.newSession(for: "u")
        let sealed = keys.seal("r.refresh-token", for: a)
        #expect(!sealed.contains("refresh-token"))
        #expect(keys.seal("r.refresh-token", for: a) != sealed, "random nonce")
        #expect(keys.open(sealed, for: a) == "r.refresh-token")
        #expect(keys.open(sealed, for: b) == nil, "moved to another session")
        var tampered = Array(sealed.utf8)
        tampered[20] = tampered[20] == UInt8(ascii: "A") ? UInt8(ascii: "B") : UInt8(ascii: "A")
        #expect(keys.open(String(decoding: tampered, as: UTF8.self), for: a) == nil)
    }

    @Test func theCookieTagIsHMACSHA256() {
        for n in 0..<20 {
            let id = (0..<32).map { UInt8(truncatingIfNeeded: $0 * 7 + n) }
            #expect(Array(keys.tag(id)) == Array(HMAC<SHA256>.authenticationCode(for: id, using: keys.cookieKey)))
            #expect(Array(keys.tag(id, sub: Array("user.\(n)".utf8))) == Array(HMAC<SHA256>.authenticationCode(for: id + Array(".user.\(n)".utf8), using: keys.cookieKey)))
        }
    }

    @Test func shortSecretsAreRefused() {
        #expect(throws: SessionKeys.SecretTooShort.self) { try SessionKeys(secret: Array(repeating: 1, count: 31)) }
    }

    @Test func handlesFromStoresAreValidated() {
        #expect(SessionHandle(key: String(repeating: "a", count: 64)) != nil)
        #expect(SessionHandle(key: String(repeating: "A", count: 64)) == nil)
        #expect(SessionHandle(key: String(repeating: "a", count: 63)) == nil)
    }
}

extension SessionKeys {
    /// A session as cookies were made before they carried the user: `base64url(id ‖ HMAC(id))`.
    func legacySession() -> (cookie: String, handle: SessionHandle) {
        let id = (0..<Self.idLength).map { _ in UInt8.random(in: .min ... .max) }
        return (Base64URL.encode(id + Array(tag(id))), SessionHandle(id: id, sub: nil))
    }
}

@Suite("Local session cache")
struct LocalSessionCacheTests {
    static let keys = try! SessionKeys(secret: Array(repeating: 3, count: 32))
    static func handles(_ count: Int) -> [SessionHandle] { (0..<count).map { _ in keys.newSession(for: "u").1 } }

    @Test func sharedByEveryLoopAndInvalidatedAtOnce() async throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 2)
        let cache = LocalSessionCache<String>(ttl: .seconds(60))
        let h = Self.handles(3)
        let loops = Array(group.makeIterator())
        try await loops[0].submit {
            cache.put(h[0], sub: "u1", "one")
            cache.put(h[1], sub: "u1", "one bis")
            cache.put(h[2], sub: "u2", "two")
        }.get()
        // Put on one loop, found on the other: one copy, not a replica per loop.
        #expect(try await loops[1].submit { cache.get(h[0]) }.get() == "one")
        #expect(cache.statistics.entries == 3)
        cache.invalidate(sub: "u1")
        #expect(cache.get(h[0]) == nil && cache.get(h[1]) == nil, "every session of the user")
        #expect(cache.get(h[2]) == "two", "and only that user's")
        cache.invalidate(h[2])
        #expect(cache.get(h[2]) == nil)
        #expect(cache.statistics.entries == 0)
        try await group.shutdownGracefully()
    }

    @Test func zeroTTLDisablesAndEntriesExpire() async throws {
        let h = Self.handles(1)[0]
        let off = LocalSessionCache<Int>(ttl: .zero)
        off.put(h, sub: "u", 1)
        #expect(off.get(h) == nil)
        let short = LocalSessionCache<Int>(ttl: .milliseconds(1))
        short.put(h, sub: "u", 1)
        try await Task.sleep(for: .milliseconds(5))  // the TTL itself is what is tested
        #expect(short.get(h) == nil)
    }

    @Test func updateKeepsTheEntryAndPutReplaces() {
        let cache = LocalSessionCache<Int>(ttl: .seconds(60))
        let h = Self.handles(1)[0]
        cache.update(h) { $0 += 1 }
        #expect(cache.get(h) == nil, "update does not create")
        cache.put(h, sub: "u", 1)
        cache.update(h) { $0 += 1 }
        #expect(cache.get(h) == 2)
        cache.put(h, sub: "v", 5)
        #expect(cache.get(h) == 5 && cache.statistics.entries == 1)
        cache.invalidate(sub: "u")
        #expect(cache.get(h) == 5, "the entry moved to its new user")
    }

    @Test("a user's sessions leave the cache together, whichever of them went alone before, and no one else's with them")
    func userChains() {
        let cache = LocalSessionCache<Int>(ttl: .seconds(60), capacity: 64, stripes: 1)
        let hs = Self.handles(7)
        for (i, h) in hs.enumerated() { cache.put(h, sub: i % 2 == 0 ? "u" : "v", i) }  // u: 0 2 4 6, v: 1 3 5
        cache.invalidate(hs[4])  // the middle of u's chain
        cache.invalidate(hs[5])  // the head of v's
        cache.put(hs[2], sub: "u", 20)  // replaced: out of the chain and back in at its head
        cache.invalidate(sub: "u")
        #expect([0, 2, 4, 6].allSatisfy { cache.get(hs[$0]) == nil })
        #expect(cache.get(hs[1]) == 1 && cache.get(hs[3]) == 3)
        cache.invalidate(sub: "v")
        #expect(cache.statistics.entries == 0)
    }

    @Test("two sessions whose fingerprints collide are never confused: the later one is cached, the other misses")
    func fingerprintCollision() throws {
        // The fingerprint is hex digits 2–17 of the handle: these two differ only after them.
        let first = try #require(SessionHandle(key: "ab" + String(repeating: "1", count: 16) + String(repeating: "2", count: 46)))
        let second = try #require(SessionHandle(key: "ab" + String(repeating: "1", count: 16) + String(repeating: "3", count: 46)))
        #expect(LocalSessionCache<Int>.fingerprint(first) == LocalSessionCache<Int>.fingerprint(second))
        let cache = LocalSessionCache<Int>(ttl: .seconds(60), capacity: 8, stripes: 1)
        cache.put(first, sub: "u", 1)
        #expect(cache.get(second) == nil)
        cache.put(second, sub: "v", 2)
        #expect(cache.get(first) == nil && cache.get(second) == 2 && cache.statistics.entries == 1)
        cache.invalidate(first)  // not cached: leaves the other alone
        #expect(cache.get(second) == 2)
        cache.invalidate(sub: "u")
        #expect(cache.get(second) == 2)
    }

    /// A request as the gateway makes it: the cache first, on a miss the store, then `put`.
    /// Whether it hit.
    @discardableResult
    static func request(_ cache: LocalSessionCache<Int>, _ handle: SessionHandle, sub: String = "u", _ value: Int = 0) -> Bool {
        if cache.get(handle) != nil { return true }
        cache.put(handle, sub: sub, value)
        return false
    }

    @Test func boundedWithLeastRecentlyUsedEviction() {
        // One stripe, so that the order of eviction is the CLOCK's alone.
        let cache = LocalSessionCache<Int>(ttl: .seconds(60), capacity: 4, stripes: 1)
        let h = Self.handles(8)
        for i in 0..<4 { cache.put(h[i], sub: "u\(i)", i) }
        // 0 and 2 are in use; 1 and 3 are not. 4 and 5 are asked for twice each (the first
        // time is refused: see the admission tests): they take the places of 1 and 3.
        #expect(cache.get(h[0]) == 0 && cache.get(h[2]) == 2)
        for _ in 0..<2 {
            Self.request(cache, h[4], sub: "u4", 4)
            Self.request(cache, h[5], sub: "u5", 5)
        }
        #expect(cache.get(h[1]) == nil && cache.get(h[3]) == nil)
        #expect(cache.get(h[0]) == 0 && cache.get(h[2]) == 2 && cache.get(h[4]) == 4 && cache.get(h[5]) == 5)
        #expect(cache.statistics == (entries: 4, evictions: 2))
        cache.invalidate(sub: "u1")  // evicted: its index went with it
        #expect(cache.statistics.entries == 4)
        cache.flush()
        #expect(cache.statistics.entries == 0)
        for i in 0..<4 { cache.put(h[i], sub: "u", i) }
        #expect(cache.statistics == (entries: 4, evictions: 2), "freed slots are reused before anything is evicted")
        cache.invalidate(sub: "u")
        #expect(cache.statistics.entries == 0)
    }

    @Test func neverHoldsMoreThanItsCapacity() {
        let cache = LocalSessionCache<Int>(ttl: .seconds(60), capacity: 64)
        for (i, h) in Self.handles(1_000).enumerated() {
            Self.request(cache, h, sub: "u\(i % 10)", i)
            Self.request(cache, h, sub: "u\(i % 10)", i)
        }
        #expect(cache.statistics.entries <= cache.capacity)
        #expect(cache.statistics.evictions >= 1)
        for i in 0..<10 { cache.invalidate(sub: "u\(i)") }
        #expect(cache.statistics.entries == 0)
    }

    // Admission (TinyLFU, `FrequencySketch`): what a full cache takes in.

    @Test("while the cache has room every session is cached, even one asked for once")
    func admitsEverythingWhileNotFull() {
        let cache = LocalSessionCache<Int>(ttl: .seconds(60), capacity: 64, stripes: 1)
        let h = Self.handles(64)
        for (i, handle) in h.enumerated() { cache.put(handle, sub: "u", i) }
        #expect(h.enumerated().allSatisfy { cache.get($1) == $0 })
        #expect(cache.statistics == (entries: 64, evictions: 0))
    }

    @Test("a one-off session does not evict a session that is asked for again")
    func oneOffsDoNotEvict() {
        let cache = LocalSessionCache<Int>(ttl: .seconds(60), capacity: 4, stripes: 1)
        let regulars = Self.handles(4)
        for (i, h) in regulars.enumerated() { cache.put(h, sub: "u", i) }
        for one in Self.handles(100) {
            #expect(!Self.request(cache, one), "a one-off misses")
            for h in regulars { Self.request(cache, h) }
        }
        #expect(regulars.enumerated().allSatisfy { cache.get($1) == $0 }, "the regulars stayed")
        #expect(cache.statistics == (entries: 4, evictions: 0))
    }

    @Test("a full cache takes in a session on its second miss, in place of one not asked for since")
    func returningSessionIsAdmitted() {
        let cache = LocalSessionCache<Int>(ttl: .seconds(60), capacity: 4, stripes: 1)
        let h = Self.handles(5)
        for i in 0..<4 { cache.put(h[i], sub: "u", i) }
        #expect(!Self.request(cache, h[4], 4))
        #expect(cache.statistics == (entries: 4, evictions: 0), "first miss: refused")
        #expect(!Self.request(cache, h[4], 4))
        #expect(cache.get(h[4]) == 4)
        #expect(cache.statistics == (entries: 4, evictions: 1))
    }

    @Test("in a loop over more sessions than the cache holds, most requests still hit")
    func loopLargerThanTheCacheKeepsHitting() {
        // The bench's rotation: 120 sessions in turn through a cache of 100. Admitting every
        // miss (CLOCK alone, as LRU) evicts each time the session the loop asks for next: no
        // hits at all. Refusing the candidates keeps 100 of the 120 (≈ 83 %).
        let cache = LocalSessionCache<Int>(ttl: .seconds(60), capacity: 100, stripes: 1)
        let h = Self.handles(120)
        for _ in 0..<10 { for handle in h { Self.request(cache, handle) } }
        var hits = 0
        for _ in 0..<10 { for handle in h where Self.request(cache, handle) { hits += 1 } }
        #expect(hits >= 10 * 120 * 3 / 4, "\(hits) hits of \(10 * 120)")
    }

    @Test("a session of an invalidated user gives its place to any session, even a one-off")
    func invalidationFreesPlaces() {
        let cache = LocalSessionCache<Int>(ttl: .seconds(60), capacity: 4, stripes: 1)
        let h = Self.handles(6)
        for i in 0..<4 { cache.put(h[i], sub: i < 2 ? "gone" : "stays", i) }
        for _ in 0..<3 { for i in 0..<4 { Self.request(cache, h[i]) } }
        cache.invalidate(sub: "gone")
        #expect(!Self.request(cache, h[4], 4) && !Self.request(cache, h[5], 5))
        #expect(cache.get(h[4]) == 4 && cache.get(h[5]) == 5 && cache.get(h[2]) == 2 && cache.get(h[3]) == 3)
        #expect(cache.statistics == (entries: 4, evictions: 0))
    }

    @Test("an expired session gives its place to any session, even a one-off")
    func expiredEntriesAreReplaced() async throws {
        let cache = LocalSessionCache<Int>(ttl: .milliseconds(200), capacity: 4, stripes: 1)
        let h = Self.handles(5)
        for i in 0..<4 { cache.put(h[i], sub: "u", i) }
        for _ in 0..<3 { for i in 0..<4 { Self.request(cache, h[i]) } }
        try await Task.sleep(for: .milliseconds(250))  // the TTL itself is what is tested
        cache.put(h[4], sub: "u", 4)
        #expect(cache.get(h[4]) == 4)
        #expect(cache.statistics.evictions == 0, "an expired entry is not counted as evicted")
    }
}

@Suite("base64url")
struct Base64URLTests {
    @Test func roundTripsEveryLength() {
        for length in 0..<70 {
            let bytes = (0..<length).map { UInt8(truncatingIfNeeded: $0 &* 37 &+ 11) }
            let text = Base64URLPeek.encode(bytes)
            #expect(!text.contains("=") && !text.contains("+") && !text.contains("/"))
            #expect(Base64URLPeek.decode(text) == bytes, "length \(length)")
        }
        #expect(Base64URLPeek.decode("A") == nil)
        #expect(Base64URLPeek.decode("AB=") == nil)
        #expect(Base64URLPeek.decode("AA") == [0])
        #expect(Base64URLPeek.decode("AB") == nil, "non-zero padding bits")
    }
}

enum Base64URLPeek {
    static func encode(_ bytes: [UInt8]) -> String { Base64URL.encode(bytes) }
    static func decode(_ text: String) -> [UInt8]? { Base64URL.decode(Substring(text)) }
}
