import Testing

@testable import Sessions

/// The pure policies of admission and re-validation (issue 13 §1–§2), as tables.
@Suite("Session and retry policies")
struct SessionPolicyTests {
    static let hour: Int64 = 3_600_000
    static let day = 24 * hour
    static let times = RevalidationTimes(after: day, grace: hour, outageGrace: 3 * day)
    static let policy = SessionPolicy(times: SessionTimes(idle: 7 * day, absolute: 30 * day), revalidation: times)
    static let handle = SessionHandle(key: String(repeating: "ab", count: 32))!

    /// A moment: absolute, or relative to the session's due time (its jitter included).
    enum At {
        case ms(Int64)
        case afterDue(Int64)
    }

    struct Row: CustomTestStringConvertible, Sendable {
        var name: String
        var created: Int64 = 0
        var lastSeen: Int64 = 0
        var validatedAt: Int64 = 0
        var revokedAt: Int64? = nil
        var token = true
        var at: At
        var expected: SessionPolicy.Decision
        var testDescription: String { name }
    }

    static func stored(_ row: Row) -> StoredSession {
        StoredSession(session: SessionRecord(handle: handle, sub: "001.a", clientID: "c", created: row.created, lastSeen: row.lastSeen,
                                             validatedAt: row.validatedAt, sealedRefreshToken: row.token ? "sealed" : nil),
                      user: UserProfile(sub: "001.a"), revokedAt: row.revokedAt)
    }

    @Test("due time: revalidate_after plus a per-session jitter under an hour; never earlier")
    func dueTime() {
        let session = Self.stored(Row(name: "", validatedAt: 5, at: .ms(0), expected: .dead(.revoked))).session
        let due = Self.times.dueAt(session)
        #expect(due >= 5 + Self.day && due < 5 + Self.day + Self.hour)
        let short = RevalidationTimes(after: 10, grace: 0, outageGrace: 0)
        #expect(short.dueAt(session) == 15, "below 24 ms of revalidate_after there is no room for jitter")
    }

    @Test("what a stored session is worth", arguments: [
        Row(name: "fresh, just used", lastSeen: 0, at: .ms(1000), expected: .live(touch: false, revalidation: .none)),
        Row(name: "used a minute ago: activity is written", at: .ms(60_000), expected: .live(touch: true, revalidation: .none)),
        Row(name: "revoked after it was created", created: 10, lastSeen: 10, validatedAt: 10, revokedAt: 10, at: .ms(20), expected: .dead(.revoked)),
        Row(name: "revoked before it was created (an older revocation)", created: 10, lastSeen: 10, validatedAt: 10, revokedAt: 9, at: .ms(20),
            expected: .live(touch: false, revalidation: .none)),
        Row(name: "idle for the idle timeout", at: .ms(7 * day), expected: .dead(.idleTimeout)),
        Row(name: "past the absolute timeout though active", lastSeen: 30 * day - 1000, at: .ms(30 * day), expected: .dead(.absoluteTimeout)),
        Row(name: "not due yet", at: .afterDue(-1), expected: .live(touch: true, revalidation: .none)),
        Row(name: "due: stale within the grace", at: .afterDue(0), expected: .live(touch: true, revalidation: .background)),
        Row(name: "stale beyond the grace", at: .afterDue(hour), expected: .live(touch: true, revalidation: .beforeAnswering)),
        Row(name: "no refresh token (a native sign-in without one): never re-validated", token: false, at: .afterDue(2 * day),
            expected: .live(touch: true, revalidation: .none)),
    ])
    func decide(row: Row) {
        let stored = Self.stored(row)
        let t: Int64
        switch row.at {
        case .ms(let ms): t = ms
        case .afterDue(let delta): t = Self.times.dueAt(stored.session) + delta
        }
        #expect(Self.policy.decide(stored, now: t) == row.expected)
    }

    @Test("without Apple's answer a session is kept within outage_grace of its last success, then denied")
    func outage() {
        let session = Self.stored(Row(name: "", validatedAt: 1000, at: .ms(0), expected: .dead(.revoked))).session
        #expect(Self.policy.keepsWithoutApple(session, now: 1000 + 3 * Self.day))
        #expect(!Self.policy.keepsWithoutApple(session, now: 1001 + 3 * Self.day))
        let noApple = SessionPolicy(times: Self.policy.times, revalidation: nil)
        #expect(noApple.keepsWithoutApple(session, now: .max))
    }

    // MARK: retry cadence

    static let retry = RetryPolicy(times)

    @Test("backoff bounds: a minute to six hours for a daily re-validation; scaled for short ones")
    func bounds() {
        #expect(Self.retry.base == 60_000 && Self.retry.cap == 6 * Self.hour)
        let hourly = RetryPolicy(RevalidationTimes(after: Self.hour, grace: 0, outageGrace: Self.day))
        #expect(hourly.base == 2500 && hourly.cap == 15 * 60_000)
        let tiny = RetryPolicy(RevalidationTimes(after: 100, grace: 0, outageGrace: 0))
        #expect(tiny.base == 1000 && tiny.cap == 1000)
    }

    @Test("the delay doubles from the base to the cap; jitter spreads its second half", arguments: [
        (1, 0.0, 30_000), (1, 0.999_999, 59_999), (2, 0.0, 60_000), (3, 0.5, 180_000), (9, 0.0, 7_680_000),
        (10, 0.0, 3 * hour), (10, 1.0, 6 * hour), (200, 0.0, 3 * hour), (0, 0.0, 30_000), (1, -3.0, 30_000), (1, 7.0, 60_000),
    ] as [(Int, Double, Int64)])
    func delay(failures: Int, jitter: Double, expected: Int64) {
        #expect(Self.retry.delay(failures: failures, jitter: jitter) == expected)
    }

    @Test("throttled (429), the delay starts at 15 minutes for a daily re-validation and doubles to the same cap", arguments: [
        (1, 0.0, 450_000), (1, 1.0, 900_000), (2, 0.0, 900_000), (4, 1.0, 2 * hour), (5, 0.0, 2 * hour), (6, 0.0, 3 * hour), (60, 1.0, 6 * hour),
    ] as [(Int, Double, Int64)])
    func throttledDelay(failures: Int, jitter: Double, expected: Int64) {
        #expect(Self.retry.throttledBase == 15 * 60_000)
        #expect(Self.retry.delay(failures: failures, jitter: jitter, .throttled) == expected)
        let tiny = RetryPolicy(RevalidationTimes(after: 100, grace: 0, outageGrace: 0))
        #expect(tiny.throttledBase == 1000, "never below the base nor above the cap")
    }

    /// How many calls the schedule makes in the 24 hours after a first failure at 0, every
    /// attempt failing, and in the 24 hours after those.
    static func callsPerDay(_ failure: RetryPolicy.Failure, jitter: Double) -> (first: Int, second: Int) {
        var record = Self.retry.failed(after: nil, at: 0, retryAfter: nil, jitter: jitter, failure)
        var calls = [1, 0]
        while record.retryAt < 2 * Self.day {
            calls[record.retryAt < Self.day ? 0 : 1] += 1
            record = Self.retry.failed(after: record, at: record.retryAt, retryAfter: nil, jitter: jitter, failure)
        }
        return (calls[0], calls[1])
    }

    @Test("a throttled token is asked a few times a day, fewer than an unreachable Apple's; the fleet's circuit makes that the whole fleet's count", arguments: [0.0, 0.5, 1.0])
    func throttledCadence(jitter: Double) {
        let throttled = Self.callsPerDay(.throttled, jitter: jitter), unavailable = Self.callsPerDay(.unavailable, jitter: jitter)
        #expect(throttled.first <= 12 && throttled.second <= 8, "\(throttled)")
        #expect(throttled.first < unavailable.first, "\(throttled) against \(unavailable)")
    }

    @Test("a failure counts on from a failure, restarts after a success, and honours Retry-After", arguments: [
        ("first failure", nil, nil, 1, 60_000),
        ("after a success", ValidationRecord(result: .ok, at: 1), nil, 1, 60_000),
        ("third in a row", ValidationRecord(result: .failed, at: 1, failures: 2, retryAt: 5), nil, 3, 240_000),
        ("Retry-After longer than the backoff", nil, 7200, 1, 7_200_000),
        ("Retry-After shorter than the backoff", ValidationRecord(result: .failed, at: 1, failures: 4, retryAt: 5), 10, 5, 960_000),
    ] as [(String, ValidationRecord?, Int?, Int, Int64)])
    func failed(name: String, previous: ValidationRecord?, retryAfter: Int?, failures: Int, wait: Int64) {
        let t: Int64 = 1_000_000
        let record = Self.retry.failed(after: previous, at: t, retryAfter: retryAfter, jitter: 1)
        #expect(record == ValidationRecord(result: .failed, at: t, failures: failures, retryAt: t + wait), "\(name)")
        #expect(Self.retry.keep(record, now: t) == wait + 3 * Self.day, "kept until the retry, then outage_grace more")
    }

    @Test("what the fleet's record says to do", arguments: [
        ("no record: ask", nil, 100, 200, RetryPolicy.Step.ask(failures: 0)),
        ("a newer success: adopt it", ValidationRecord(result: .ok, at: 150), 100, 200, .adopt(validatedAt: 150)),
        ("an older success: ask", ValidationRecord(result: .ok, at: 90), 100, 200, .ask(failures: 0)),
        ("revoked", ValidationRecord(result: .revoked, at: 150), 100, 200, .revoked),
        ("failing, backing off", ValidationRecord(result: .failed, at: 150, failures: 2, retryAt: 201), 100, 200, .wait),
        ("failing, retry due", ValidationRecord(result: .failed, at: 150, failures: 2, retryAt: 200), 100, 200, .ask(failures: 2)),
        ("failing beyond outage_grace: given up", ValidationRecord(result: .failed, at: 150, failures: 9, retryAt: 200), 100, 100 + 3 * day + 1, .givenUp),
        ("backing off beyond outage_grace: still no call", ValidationRecord(result: .failed, at: 150, failures: 9, retryAt: .max), 100, 100 + 3 * day + 1, .wait),
        ("a success beyond outage_grace (the user came back after days): adopt", ValidationRecord(result: .ok, at: 150), 100, 100 + 4 * day, .adopt(validatedAt: 150)),
    ] as [(String, ValidationRecord?, Int64, Int64, RetryPolicy.Step)])
    func step(name: String, record: ValidationRecord?, validatedAt: Int64, now: Int64, expected: RetryPolicy.Step) {
        #expect(Self.retry.step(record, validatedAt: validatedAt, now: now) == expected, "\(name)")
    }

    @Test("a client's circuit holds calls back until its probe is due, and never probes with a session beyond outage_grace", arguments: [
        ("no record: closed", nil, 50, RetryPolicy.Circuit.closed),
        ("a success: closed", ValidationRecord(result: .ok, at: 1), 50, .closed),
        ("failed, not due: holds", ValidationRecord(result: .failed, at: 1, failures: 1, retryAt: 101), 50, .holds),
        ("failed, due: one probe", ValidationRecord(result: .failed, at: 1, failures: 1, retryAt: 100), 50, .probe),
        ("due, the session denied already: no probe", ValidationRecord(result: .failed, at: 1, failures: 1, retryAt: 100), 100 - 3 * day - 1, .givenUp),
        ("not due, the session denied already: holds", ValidationRecord(result: .failed, at: 1, failures: 1, retryAt: 101), 100 - 3 * day - 1, .holds),
    ] as [(String, ValidationRecord?, Int64, RetryPolicy.Circuit)])
    func circuit(name: String, record: ValidationRecord?, validatedAt: Int64, expected: RetryPolicy.Circuit) {
        #expect(Self.retry.circuit(record, validatedAt: validatedAt, now: 100) == expected, "\(name)")
    }
}
