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

    @Test func forgedCookiesAreRejected() throws {
        let (cookie, _) = keys.newSession(for: "user.a")
        var bytes = Array(cookie.utf8)
        // Every single-character change, in the id, the tag and the user.
        for i in stride(from: 0, to: bytes.count, by: 3) {
            let original = bytes[i]
            bytes[i] = original == UInt8(ascii: "A") ? UInt8(ascii: "B") : UInt8(ascii: "A")
            #expect(keys.handle(forCookie: Substring(String(decoding: bytes, as: UTF8.self))) == nil, "position \(i)")
            bytes[i] = original
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

    @Test func boundedWithLeastRecentlyUsedEviction() {
        // One stripe, so that the order of eviction is the CLOCK's alone.
        let cache = LocalSessionCache<Int>(ttl: .seconds(60), capacity: 4, stripes: 1)
        let h = Self.handles(8)
        for i in 0..<4 { cache.put(h[i], sub: "u\(i)", i) }
        // 0 and 2 are in use; 1 and 3 are not: the next two puts take the places of 1 and 3.
        #expect(cache.get(h[0]) == 0 && cache.get(h[2]) == 2)
        cache.put(h[4], sub: "u4", 4)
        cache.put(h[5], sub: "u5", 5)
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
            cache.put(h, sub: "u\(i % 10)", i)
            _ = cache.get(h)
        }
        #expect(cache.statistics.entries <= cache.capacity)
        #expect(cache.statistics.evictions >= 1_000 - cache.capacity)
        for i in 0..<10 { cache.invalidate(sub: "u\(i)") }
        #expect(cache.statistics.entries == 0)
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
