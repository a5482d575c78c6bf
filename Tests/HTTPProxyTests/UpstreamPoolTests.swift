import NIOCore
import NIOEmbedded
import Testing

@testable import HTTPProxy

/// The pool's bookkeeping without sockets: connections are taken only by their principal; a
/// principal keeps idle as many as it lately had in flight; an upstream's budget counts every
/// open connection, an idle one gives way to a new principal's, and a request over it waits
/// its turn or is answered busy.
@Suite("Upstream pool: idle connections per principal, budgets per upstream (no I/O)")
struct UpstreamPoolTests {
    /// A host name never resolved: a connect the pool starts fails at once (no socket).
    static let app = UpstreamAddress(host: "app.invalid", port: 1)
    static let other = UpstreamAddress(host: "other.invalid", port: 2)

    let loop = EmbeddedEventLoop()

    func pool(total: Int = 256) -> UpstreamPool {
        UpstreamPool(eventLoop: loop, connectTimeout: .seconds(1), idleTimeout: .seconds(60),
                     limits: UpstreamPoolLimits(idleTotal: total), observer: SilentProxyObserver())
    }

    /// A connection of `principal`, in use (as `connect` hands it out).
    func inUse(_ p: UpstreamPool, _ principal: UpstreamPrincipal?, _ address: UpstreamAddress = app) -> UpstreamConnection {
        let connection = UpstreamConnection(address: address, principal: principal)
        p.adopt(connection)
        return connection
    }

    /// What a `connect` call got, once it got it.
    final class Outcome {
        var result: Result<UpstreamConnection, any Error>? = nil
        var connection: UpstreamConnection? { try? result?.get() }
        var failure: (any Error)? {
            if case .failure(let error) = result { return error }
            return nil
        }
    }

    func connect(_ p: UpstreamPool, _ principal: UpstreamPrincipal?, limit: Int) -> Outcome {
        let outcome = Outcome()
        p.connect(Self.app, for: principal, limit: limit, on: loop) { outcome.result = $0 }
        return outcome
    }

    @Test("a connection that outlives its pool (its server gone, the app still connected) closes without touching the pool")
    func outlivesItsPool() throws {
        let channel = EmbeddedChannel(loop: loop)
        let connection = UpstreamConnection(address: Self.app, principal: .user("alice"))
        try channel.pipeline.syncOperations.addHandler(connection)
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        var p: UpstreamPool? = pool()
        p!.adopt(connection)
        weak var gone = p
        p = nil
        #expect(gone == nil, "the connection does not keep its pool")
        // The app closes the connection: with an unowned reference to the pool, this crashed.
        try channel.close().wait()
        #expect(connection.pool == nil)
    }

    @Test("a kept connection is taken only by its own principal, on its own upstream")
    func ownPrincipalOnly() {
        let p = pool()
        let alice = inUse(p, .user("alice"))
        p.release(alice)
        #expect(p.takeIdle(Self.app, for: .user("bob")) == nil)
        #expect(p.takeIdle(Self.app, for: .client(1)) == nil)
        #expect(p.takeIdle(Self.app, for: .anyone) == nil)
        #expect(p.takeIdle(Self.app, for: .echoing) == nil)
        #expect(p.takeIdle(Self.other, for: .user("alice")) == nil)
        #expect(p.takeIdle(Self.app, for: .user("alice")) === alice)
        #expect(p.takeIdle(Self.app, for: .user("alice")) == nil, "taken once")
    }

    @Test("a principal keeps idle as many connections as it had in flight at once: six of a browser's six, fifty of an API client's fifty")
    func keepsItsConcurrency() {
        for width in [6, 50] {
            let p = pool()
            let connections = (0..<width).map { _ in inUse(p, .user("alice")) }
            for c in connections { p.release(c) }
            #expect(p.idleCount == width)
            #expect(connections.allSatisfy { $0.isActive }, "none closed")
            // The next burst takes them all back: no connect.
            let again = (0..<width).compactMap { _ in p.takeIdle(Self.app, for: .user("alice")) }
            #expect(again.count == width)
            #expect(p.openCount(Self.app) == width)
        }
    }

    @Test("one request at a time keeps one connection; one for a single request is never kept")
    func sequentialKeepsOne() {
        let p = pool()
        p.release(inUse(p, .user("bob")))
        let second = inUse(p, .user("bob"))  // opened while the first was idle: two open, one in flight
        p.release(second)
        #expect(p.idleCount == 1 && !second.isActive, "the peak in flight was one")
        #expect(p.openCount(Self.app) == 1)
        let once = inUse(p, nil)
        p.release(once)
        #expect(!once.isActive && p.idleCount == 1)
        #expect(p.openCount(Self.app) == 1, "a closed connection leaves the budget")
    }

    @Test("the peak follows recent concurrency: two idle timeouts after a burst, a principal keeps what it has in flight now")
    func peakDecays() {
        let p = pool()
        let burst = (0..<6).map { _ in inUse(p, .user("carol")) }
        for c in burst { p.release(c) }
        #expect(p.idleCount == 6)
        loop.advanceTime(by: .seconds(60))
        #expect(p.idleCount == 0 && burst.allSatisfy { !$0.isActive }, "idle past the idle timeout: closed")
        loop.advanceTime(by: .seconds(60))
        // The burst is two windows old: one request in flight keeps one connection.
        let a = inUse(p, .user("carol"))
        let b = inUse(p, .user("carol"))
        p.release(a)
        p.release(b)
        #expect(p.idleCount == 2, "two in flight at once: two kept")
        #expect(p.openCount(Self.app) == 2)
    }

    @Test("beyond the idle total the least recently released closes; taking and giving back makes a connection recent again")
    func leastRecentlyUsedOut() {
        let p = pool(total: 3)
        let (a, b, c, d) = (inUse(p, .user("a")), inUse(p, .user("b")), inUse(p, .user("c")), inUse(p, .user("d")))
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
        #expect(p.openCount(Self.app) == 3)
    }

    @Test("a closed client connection's kept connections are closed with it; others stay")
    func clientClosed() {
        let p = pool()
        let mine = inUse(p, .client(7))
        let theirs = inUse(p, .client(8))
        p.release(mine)
        p.release(theirs)
        p.clientClosed(7)
        #expect(!mine.isActive)
        #expect(p.idleCount == 1)
        #expect(p.openCount(Self.app) == 1)
        #expect(p.takeIdle(Self.app, for: .client(8)) === theirs)
    }

    @Test("at the upstream's budget, the least recently used idle connection gives way to another principal's new one")
    func idleGivesWay() {
        let p = pool()
        let alice = inUse(p, .user("alice"))
        p.release(alice)
        let bob = connect(p, .user("bob"), limit: 1)
        #expect(!alice.isActive, "alice's idle connection was closed for bob's")
        #expect(bob.failure is UnresolvedUpstream, "bob's connect was started (and failed: no such host)")
        #expect(p.openCount(Self.app) == 0 && p.idleCount == 0)
    }

    @Test("over the budget with nothing idle a request waits, and takes the connection its own principal releases first")
    func waitsForItsOwn() {
        let p = pool()
        let first = inUse(p, .user("alice"))
        let second = connect(p, .user("alice"), limit: 1)
        #expect(second.result == nil, "waiting")
        p.release(first)
        #expect(second.connection === first, "handed over, no connect")
        #expect(first.isActive && p.idleCount == 0 && p.openCount(Self.app) == 1)
    }

    @Test("a waiting request of another principal gets the released connection's place: that one closes and a new one opens")
    func waiterOfAnotherPrincipal() {
        let p = pool()
        let alice = inUse(p, .user("alice"))
        let bob = connect(p, .user("bob"), limit: 1)
        #expect(bob.result == nil)
        p.release(alice)
        #expect(!alice.isActive)
        #expect(bob.failure is UnresolvedUpstream, "bob's own connect was started")
        #expect(p.openCount(Self.app) == 0)
    }

    @Test("a connection that closes while in use frees its place for the first waiting request")
    func closedInUseFreesAPlace() {
        let p = pool()
        let alice = inUse(p, .user("alice"))
        let bob = connect(p, .user("bob"), limit: 1)
        p.closed(alice)  // the app closed it (channelInactive)
        #expect(bob.failure is UnresolvedUpstream)
        #expect(p.openCount(Self.app) == 0)
    }

    @Test("a request that finds no place within the connect timeout is answered busy, in the order they came")
    func busyAfterTheConnectTimeout() {
        let p = pool()
        _ = inUse(p, .user("alice"))
        let bob = connect(p, .user("bob"), limit: 1)
        loop.advanceTime(by: .milliseconds(500))
        let carol = connect(p, .user("carol"), limit: 1)
        loop.advanceTime(by: .milliseconds(500))
        #expect(bob.failure is UpstreamBusy)
        #expect(carol.result == nil, "carol came later")
        loop.advanceTime(by: .milliseconds(500))
        #expect(carol.failure is UpstreamBusy)
        #expect(p.openCount(Self.app) == 1)
    }

    @Test("an instance-wide budget is split across the event loops, at least one each")
    func budgetShares() {
        #expect(UpstreamPoolLimits(loops: 2).share(1024) == 512)
        #expect(UpstreamPoolLimits(loops: 3).share(10) == 4)
        #expect(UpstreamPoolLimits(loops: 8).share(1) == 1)
        #expect(UpstreamPoolLimits(loops: 2).share(0) == 0, "0: no bound")
    }
}
