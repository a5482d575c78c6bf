import AllocationCounter
import NIOCore
import NIOPosix
import TestSupport
import Testing

/// Heap allocations per request of a signed-in user, counted on the gateway's one event loop
/// (the app, the client and every other suite run on other threads): what admission, the
/// identity headers, forwarding and the pool cost, and on a miss the store's round trip. The
/// whole product runs (`SignInHarness`); the count is the release build's (the debug build's was 83 and 187), as in
/// `AllocationTests`, with the same rule: above the threshold fails, well below it too.
@Suite("Allocations per request of a signed-in user (counted on the gateway's loop)", .serialized)
struct CachedSessionAllocationTests {
    struct Path: CustomTestStringConvertible, Sendable {
        let name: String
        let store: SignInHarness.Store
        let localCacheTTL: Duration
        /// Allocations per request at most (the committed count).
        let threshold: Int
        /// Allowed above it for the loop's own timers, which fire per second, not per request:
        /// a slow run has more of them per request (with Redis, its ping and its deadline timer).
        var slack: Double = 1
        var testDescription: String { name }
    }

    static let paths: [Path] = [
        // 106.8 before the cookie was read from the head's bytes; 106 before the pool's principal
        // entries were objects (a struct changed in a dictionary allocated a coroutine frame).
        Path(name: "a session in the local cache", store: .memory, localCacheTTL: .seconds(3600), threshold: 16),
        // The local cache off: every request reads Redis (one script, by its SHA-1): ~100 more
        // than a hit. 473.1 while hiredis read replies (its reply tree, copied into
        // `RESPValue`s, then the hash searched with generic algorithms); 475.8 before the
        // script's command was built in one array.
        Path(name: "a miss: the session read from Redis", store: .redis, localCacheTTL: .zero, threshold: 81, slack: 3),
    ]

    @Test("heap allocations per signed-in request stay at the committed count", arguments: paths)
    func signedIn(_ path: Path) async throws {
        try await withEventLoops(1) { loops in
            try await SignInHarness.with(store: path.store, localCacheTTL: path.localCacheTTL, loops: loops) { h in
                let sub = h.simulator.createUser(privateEmail: false, firstName: "Alloc", lastName: "Counted")
                let browser = TestBrowser(gatewayOrigin: h.origin)
                _ = try await browser.signIn(from: "/api/x", as: sub)
                let cookie = browser.cookies.map { "\($0.key)=\($0.value)" }.joined(separator: "; ")
                let port = h.gatewayPort
                let loop = loops.next()
                let perRequest = try await blocking { () -> Double in
                    let client = try RawClient(port: port, timeoutSeconds: 10)
                    func exchange() throws {
                        try client.send("GET /api/x HTTP/1.1\r\nHost: localhost:\(port)\r\nCookie: \(cookie)\r\n\r\n")
                        guard try client.readResponse().status == 200 else { throw RawClient.Failure.closed }
                    }
                    for _ in 0..<100 { try exchange() }
                    try loop.submit { sg_allocations_start() }.wait()
                    let measured = 500
                    for _ in 0..<measured { try exchange() }
                    let count = try loop.submit { sg_allocations_stop() }.wait()
                    return Double(count) / Double(measured)
                }
                print("allocations per request, \(path.name): \(perRequest)")
                // A timer of the loop's own (the store's once-a-second ping) may fire more often
                // in a slow run: `slack` more per request is allowed for it, no more.
                let problem = allocationProblem(perRequest, committed: path.threshold, slack: path.slack)
                #expect(problem == nil, "\(problem ?? "")")
            }
        }
    }
}
