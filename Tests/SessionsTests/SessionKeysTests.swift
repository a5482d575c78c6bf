import Crypto
import NIOCore
import NIOPosix
@testable import Sessions
import Testing

@Suite("Session keys and cookies")
struct SessionKeysTests {
    let keys = try! SessionKeys(secret: Array("0123456789abcdef0123456789abcdef-test".utf8))

    @Test func cookieRoundTripAndUniqueness() {
        let (cookie, handle) = keys.newSession()
        #expect(cookie.utf8.count == SessionKeys.cookieLength)
        #expect(keys.handle(forCookie: Substring(cookie)) == handle)
        #expect(handle.key.utf8.count == 64)
        let ids = Set((0..<1000).map { _ in keys.newSession().handle })
        #expect(ids.count == 1000)
    }

    @Test func forgedCookiesAreRejected() throws {
        let (cookie, _) = keys.newSession()
        var bytes = Array(cookie.utf8)
        // Every single-character change, in the id and in the tag.
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
        let (_, a) = keys.newSession()
        let (_, b) = keys.newSession()
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

@Suite("Local session cache")
struct LocalSessionCacheTests {
    @Test func perLoopEntriesAndInvalidation() async throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 2)
        let keys = try SessionKeys(secret: Array(repeating: 3, count: 32))
        let cache = LocalSessionCache<String>(group: group, ttl: .seconds(60))
        let (_, h1) = keys.newSession()
        let (_, h2) = keys.newSession()
        let loops = Array(group.makeIterator())
        for loop in loops {
            try await loop.submit {
                cache.put(h1, sub: "u1", "one", on: loop)
                cache.put(h2, sub: "u2", "two", on: loop)
            }.get()
        }
        #expect(try await loops[0].submit { cache.get(h1, on: loops[0]) }.get() == "one")
        cache.invalidate(sub: "u1")
        cache.invalidate(h2)
        // Invalidations are queued on each loop: a task submitted after them sees their effect.
        for loop in loops {
            #expect(try await loop.submit { cache.get(h1, on: loop) }.get() == nil)
            #expect(try await loop.submit { cache.get(h2, on: loop) }.get() == nil)
        }
        try await group.shutdownGracefully()
    }

    @Test func zeroTTLDisablesAndEntriesExpire() async throws {
        let loop = MultiThreadedEventLoopGroup.singleton.next()
        let keys = try SessionKeys(secret: Array(repeating: 3, count: 32))
        let (_, h) = keys.newSession()
        let off = LocalSessionCache<Int>(group: .singleton, ttl: .zero)
        #expect(try await loop.submit { off.put(h, sub: "u", 1, on: loop); return off.get(h, on: loop) }.get() == nil)
        let short = LocalSessionCache<Int>(group: .singleton, ttl: .milliseconds(1))
        try await loop.submit { short.put(h, sub: "u", 1, on: loop) }.get()
        try await Task.sleep(for: .milliseconds(5))  // the TTL itself is what is tested
        #expect(try await loop.submit { short.get(h, on: loop) }.get() == nil)
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
