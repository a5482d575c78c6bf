import AppleIDSimulator
import Foundation
import Gateway
import TestSupport
import Testing

/// How often the gateway asks Apple when Apple will not answer (issue 13 §2), counted over
/// simulated days: `revalidate_after: 24h`, sessions used every five minutes, Apple's refresh
/// calls counted by the simulator.
@Suite("Retry cadence under a failing Apple", .serialized, .timeLimit(.minutes(4)))
struct RetryCadenceTests {
    static let minute: Duration = .seconds(60)
    static let day: Duration = .seconds(86_400)

    /// The session clock is frozen before the sign-ins: simulated time moves only by the steps
    /// `drive` takes. On the wall clock plus an offset, the seconds the rounds themselves took
    /// were added to every day, and a session whose jitter was under them came due in day 0's
    /// last round (1 CI run in 20).
    static func with<Result>(store: SignInHarness.Store = .redis, _ body: (SignInHarness) async throws -> Result) async throws -> Result {
        let clock = TestClock()
        clock.freeze()
        return try await SignInHarness.with(store: store, localCacheTTL: .seconds(86_400), idleTimeout: .seconds(10 * 86_400), absoluteTimeout: .seconds(30 * 86_400),
                                     clock: clock,
                                     configure: { c in
                                         c.apple?.revalidateAfter = .seconds(86_400)
                                         c.apple?.revalidateGrace = .seconds(3600)
                                         c.apple?.outageGrace = .seconds(3 * 86_400)
                                     }, body)
    }

    /// `count` users signed in, one browser each.
    static func signIn(_ h: SignInHarness, count: Int) async throws -> [TestBrowser] {
        var browsers: [TestBrowser] = []
        for _ in 0..<count {
            let b = TestBrowser(gatewayOrigin: h.origin)
            _ = try await b.signIn(from: "/x", as: h.simulator.createUser())
            browsers.append(b)
        }
        return browsers
    }

    /// `count` users signed in, half of them using their session on a second instance.
    static func twoInstances(_ h: SignInHarness, signedIn count: Int) async throws -> [TestBrowser] {
        let b = try await h.addInstance()
        var browsers = try await signIn(h, count: count)
        for source in browsers.prefix(count / 2) {
            let onB = TestBrowser(gatewayOrigin: b.origin)
            onB.cookies = source.cookies
            browsers.append(onB)
        }
        browsers.removeFirst(count / 2)
        return browsers
    }

    /// Every browser asks for `/x` every `step` of simulated time for `span`; the statuses by
    /// simulated day (0 = the first day after the sign-ins) and Apple's refresh calls by day.
    static func drive(_ h: SignInHarness, _ browsers: [TestBrowser], for span: Duration, step: Duration = .seconds(300)) async throws
        -> (statuses: [Int: [Int: Int]], calls: [Int]) {
        var statuses: [Int: [Int: Int]] = [:]
        var calls: [Int] = []
        let (spanSeconds, stepSeconds, daySeconds) = (span.components.seconds, step.components.seconds, day.components.seconds)
        var elapsed: Int64 = 0
        var callsBefore = h.simulator.grantCount("refresh_token")
        while elapsed < spanSeconds {
            h.clock.advance(by: step)
            elapsed += stepSeconds
            let dayIndex = Int((elapsed - 1) / daySeconds)
            let round = try await withThrowingTaskGroup(of: Int.self) { group in
                for b in browsers { group.addTask { try await b.request("/x").status } }
                return try await group.reduce(into: [Int]()) { $0.append($1) }
            }
            for status in round { statuses[dayIndex, default: [:]][status, default: 0] += 1 }
            if elapsed % daySeconds == 0 || elapsed >= spanSeconds {
                let now = h.simulator.grantCount("refresh_token")
                calls.append(now - callsBefore)
                callsBefore = now
            }
        }
        return (statuses, calls)
    }

    @Test("a throttling Apple (429): the fleet backs off as one, on one slow schedule; sessions are kept within outage_grace, then denied without another call")
    func throttled() async throws {
        try await Self.with() { h in
            let browsers = try await Self.twoInstances(h, signedIn: 10)
            h.simulator.setFaults { $0.throttleInterval = 10 * 365 * 86_400 }  // every refresh is throttled (429)
            let (statuses, calls) = try await Self.drive(h, browsers, for: .seconds(4 * 86_400))
            let perToken = calls.map { Double($0) / Double(browsers.count) }
            print("retry cadence, throttling Apple: refresh calls by simulated day for 10 tokens on two instances \(calls), per token \(perToken); statuses by day \(statuses)")
            // Day 0: nothing due. Days 1–2: due and throttled; the client's circuit lets one probe
            // through per retry, for the whole fleet (each token on its own made 131 calls on day 1).
            #expect(calls[0] == 0)
            #expect(calls[1] > 0)
            #expect(calls[1] <= 12 && calls[2] <= 8, "the fleet's calls, not one schedule per token: \(calls)")
            // Three days after the last success every session is denied; Apple is asked nothing more.
            #expect(calls[3] == 0, "no calls once outage_grace has ended the sessions: \(calls)")
            let dayOne: [Int: Int] = statuses[1] ?? [:]
            #expect(dayOne.keys.sorted() == [200], "kept within outage_grace: \(statuses)")
            #expect((statuses[3]?[503] ?? 0) > 0 && statuses[3]?[200] == nil, "denied after it: \(statuses)")
        }
    }

    @Test("Apple's Retry-After is honoured by the whole fleet: one call, none before it however many requests, then one probe")
    func retryAfter() async throws {
        try await Self.with(store: .memory) { h in
            let browsers = try await Self.signIn(h, count: 3)
            h.simulator.setFaults {
                $0.throttleInterval = 10 * 365 * 86_400
                $0.retryAfter = 4 * 3600
            }
            h.clock.advance(by: Self.day + .seconds(2 * 3600))  // due and stale beyond the grace: requests wait for Apple
            for b in browsers { #expect(try await b.request("/x").status == 200) }
            #expect(h.simulator.grantCount("refresh_token") == 1, "the first 429 holds the other tokens back")
            let (_, during) = try await Self.drive(h, browsers, for: .seconds(4 * 3600 - 600))
            #expect(during.reduce(0, +) == 0, "asked again within Apple's Retry-After")
            let (_, after) = try await Self.drive(h, browsers, for: .seconds(1200))
            #expect(after.reduce(0, +) == 1, "one probe once Retry-After has passed (throttled again: the circuit closes again for 4 h)")
            h.simulator.setFaults { $0.throttleInterval = 0 }
            let (_, mended) = try await Self.drive(h, browsers, for: .seconds(4 * 3600 + 1200))
            #expect(mended.reduce(0, +) == browsers.count, "Apple answering again: the probe, then each other token once: \(mended)")
        }
    }

    @Test("Apple refuses our client: one probe for the fleet, not one call per session; sessions resume when it is mended")
    func circuit() async throws {
        try await Self.with() { h in
            let browsers = try await Self.twoInstances(h, signedIn: 6)
            h.simulator.setFaults { $0.rejectClientSecrets = true }
            h.clock.advance(by: Self.day - .seconds(300))
            let (statuses, calls) = try await Self.drive(h, browsers, for: Self.day)
            print("retry cadence, invalid_client: refresh calls for 6 sessions over a simulated day: \(calls)")
            let kept: [Int: Int] = statuses[0] ?? [:]
            #expect(kept.keys.sorted() == [200], "sessions kept within outage_grace: \(statuses)")
            // Probes back off like a token's retries (~10 in the first 8 hours, then every 3–6 h),
            // for the whole fleet: without the circuit each of the 6 sessions would call as often.
            #expect(calls.reduce(0, +) <= 20, "\(calls)")
            h.simulator.setFaults { $0.rejectClientSecrets = false }
            let (_, mended) = try await Self.drive(h, browsers, for: .seconds(7 * 3600))
            #expect(mended.reduce(0, +) == browsers.count, "the probe that finds the client mended, then each other token once: \(mended)")
        }
    }
}
