import NIOCore
import NIOEmbedded
import Testing

@testable import HTTPProxy

/// The pool's bookkeeping without sockets: connections are taken only by their principal, kept
/// within the per-principal and total bounds, least recently used out first.
@Suite("Upstream pool: idle connections per principal (no I/O)")
struct UpstreamPoolTests {
    static let app = UpstreamAddress(host: "127.0.0.1", port: 1)
    static let other = UpstreamAddress(host: "127.0.0.1", port: 2)

    func pool(perPrincipal: Int = 2, total: Int = 256) -> UpstreamPool {
        UpstreamPool(eventLoop: EmbeddedEventLoop(), connectTimeout: .seconds(1), idleTimeout: .seconds(60),
                     limits: UpstreamPoolLimits(perPrincipal: perPrincipal, perSharedUpstream: 4, total: total), observer: SilentProxyObserver())
    }

    func connection(_ principal: UpstreamPrincipal?, _ address: UpstreamAddress = app) -> UpstreamConnection {
        UpstreamConnection(address: address, principal: principal)
    }

    @Test("a kept connection is taken only by its own principal, on its own upstream")
    func ownPrincipalOnly() {
        let p = pool()
        let alice = connection(.user("alice"))
        p.release(alice)
        #expect(p.takeIdle(Self.app, for: .user("bob")) == nil)
        #expect(p.takeIdle(Self.app, for: .client(1)) == nil)
        #expect(p.takeIdle(Self.app, for: .anyone) == nil)
        #expect(p.takeIdle(Self.other, for: .user("alice")) == nil)
        #expect(p.takeIdle(Self.app, for: .user("alice")) === alice)
        #expect(p.takeIdle(Self.app, for: .user("alice")) == nil, "taken once")
    }

    @Test("at most perPrincipal are kept for one principal; one for a single request is never kept")
    func perPrincipalBound() {
        let p = pool(perPrincipal: 2)
        let three = (0..<3).map { _ in connection(.user("alice")) }
        for c in three { p.release(c) }
        #expect(p.idleCount == 2)
        #expect(!three[2].isActive, "the third was closed")
        let once = connection(nil)
        p.release(once)
        #expect(!once.isActive && p.idleCount == 2)
    }

    @Test("a multiplexing client may keep as many idle connections of its principal as it asks, within the total")
    func multiplexedKeeps() {
        let p = pool(perPrincipal: 2, total: 8)
        let ten = (0..<10).map { _ in connection(.client(1)) }
        for c in ten { p.release(c, keeping: 100) }
        #expect(p.idleCount == 8, "the total bounds it")
        let q = pool(perPrincipal: 2)
        let four = (0..<4).map { _ in connection(.client(1)) }
        for c in four { q.release(c, keeping: 3) }
        #expect(q.idleCount == 3 && !four[3].isActive)
    }

    @Test("beyond the total the least recently released closes; taking and giving back makes a connection recent again")
    func leastRecentlyUsedOut() {
        let p = pool(total: 3)
        let (a, b, c, d) = (connection(.user("a")), connection(.user("b")), connection(.user("c")), connection(.user("d")))
        p.release(a)
        p.release(b)
        p.release(c)
        #expect(p.takeIdle(Self.app, for: .user("a")) === a)
        p.release(a)  // a is the most recent now: b is the oldest
        p.release(d)
        #expect(p.idleCount == 3)
        #expect(!b.isActive, "b was evicted")
        #expect(p.takeIdle(Self.app, for: .user("b")) == nil)
        for (user, c) in [("a", a), ("c", c), ("d", d)] { #expect(p.takeIdle(Self.app, for: .user(user)) === c) }
    }

    @Test("a closed client connection's kept connections are closed with it; others stay")
    func clientClosed() {
        let p = pool()
        let mine = connection(.client(7))
        let theirs = connection(.client(8))
        p.release(mine)
        p.release(theirs)
        p.clientClosed(7)
        #expect(!mine.isActive)
        #expect(p.idleCount == 1)
        #expect(p.takeIdle(Self.app, for: .client(8)) === theirs)
    }
}
