import AppleIDSimulator
import Foundation
@testable import Gateway
import Logging
import NIOConcurrencyHelpers
import GatewayConfig
import Sessions
import TestSupport
import Testing

/// A revocation the store did not take is never lost (issue 37 §2): held by the instance that
/// received it, refused there at once, kept on disk with `store.state_dir`, applied and
/// published to the fleet once the store answers.
@Suite("Revocations held through a store outage")
struct HeldQueueTests {
    static func user(_ sub: String, at: Int64, forget: Forgetting = .grants) -> HeldRevocation.Action {
        .user(sub: sub, source: .user, at: at, happened: at, forget: forget, event: .userRevoked, reason: "disconnect", atApple: false)
    }

    @Test("a held logout refuses its session only; a held revocation the user's sessions created up to it, not later ones; an account deleted every one")
    func denials() {
        var q = HeldQueue()
        #expect(!q.denies(key: "k1", sub: "u1", created: 10))
        _ = q.hold(.session(key: "k1", sub: "u1"), keep: 1, now: 0)
        #expect(q.denies(key: "k1", sub: "u1", created: 10))
        #expect(!q.denies(key: "k2", sub: "u1", created: 10), "another session of the same user")

        let revoke = Self.user("u2", at: 100)
        _ = q.hold(revoke, keep: 1, now: 0)
        #expect(q.denies(key: "k3", sub: "u2", created: 100))
        #expect(!q.denies(key: "k4", sub: "u2", created: 101), "signed in after the revocation")

        let deleted = Self.user("u3", at: 100, forget: .everything)
        _ = q.hold(deleted, keep: 1, now: 0)
        #expect(q.denies(key: "k5", sub: "u3", created: .max - 1), "an account deleted never signs in again")

        let first = q.entries[0].id
        q.remove(first)
        #expect(!q.denies(key: "k1", sub: "u1", created: 10), "applied: no longer denied here (the store says so)")
        #expect(q.denies(key: "k3", sub: "u2", created: 100))
    }

    @Test("a journal line written before app groups (no clients) reads as a revocation of every client; one with clients keeps them")
    func journalAcrossVersions() throws {
        let old = #"{"user":{"sub":"001.a","source":"apple_notification","at":5,"forget":"grants","event":"user.revoked","reason":"consent_revoked","atApple":false}}"#
        let action = try JSONDecoder().decode(HeldRevocation.Action.self, from: Data(old.utf8))
        #expect(action == .user(sub: "001.a", source: .appleNotification, at: 5, happened: nil, forget: .grants, event: .userRevoked, reason: "consent_revoked", atApple: false))
        let grouped = HeldRevocation.Action.user(sub: "001.a", source: .appleNotification, at: 5, happened: nil, forget: .grants, event: nil, reason: nil,
                                                 atApple: false, clients: ["com.example.app"])
        #expect(try JSONDecoder().decode(HeldRevocation.Action.self, from: JSONEncoder().encode(grouped)) == grouped)
    }

    @Test("the same logout or notification held twice is kept once; beyond the capacity one more is refused; notifications not verified yet have their own, smaller bound")
    func bounds() {
        var q = HeldQueue()
        #expect(q.hold(.session(key: "k", sub: nil), keep: 1, now: 0) != .full)
        #expect(q.hold(.session(key: "k", sub: nil), keep: 1, now: 0) == .duplicate)
        #expect(q.hold(.notification(body: "b"), keep: 1, now: 0) != .duplicate)
        #expect(q.hold(.notification(body: "b"), keep: 1, now: 0) == .duplicate, "Apple redelivered it")
        #expect(q.hold(.notification(body: String(repeating: "x", count: HeldQueue.bodyLimit + 1)), keep: 1, now: 0) == .full,
                "a body far beyond Apple's is not kept")
        #expect(q.count == 2)
        for i in 1..<HeldQueue.unverifiedCapacity {
            #expect(q.hold(.notification(body: "b\(i)"), keep: 1, now: 0) != .full)
        }
        #expect(q.hold(.notification(body: "one more"), keep: 1, now: 0) == .full)
        #expect(q.hold(.session(key: "a logout still fits", sub: nil), keep: 1, now: 0) != .full, "they never crowd out logouts")
        while q.count < HeldQueue.capacity {
            _ = q.hold(.session(key: "s\(q.count)", sub: nil), keep: 1, now: 0)
        }
        #expect(q.hold(.session(key: "over", sub: nil), keep: 1, now: 0) == .full)
        #expect(q.oldest == 0)
    }

    struct Refused: Error {}

    @Test("a replay goes past an entry the store fails, stops after three failures in a row, passes over the other unverified notifications once Apple's keys fail, and applies a verified notification as what it says at once")
    func replayRules() async throws {
        let held = try HeldRevocations(journal: nil, metrics: GatewayMetrics(), logger: Logger(label: "held"), now: { 0 })
        let actions: [HeldRevocation.Action] = [.session(key: "fails", sub: nil), .notification(body: "n1"), .notification(body: "n2"),
                                                .session(key: "ok", sub: nil), .notification(body: "verifies")]
        for action in actions { #expect(await held.hold(action, keep: 1, why: Refused())) }
        let seen = NIOLockedValueBox<[String]>([])
        let keysDown = NIOLockedValueBox(true)
        held.setApply { entry in
            let name: String = switch entry.action {
            case .session(let key, _): key
            case .notification(let body): body
            case .user(let sub, _, _, _, _, _, _, _, _): "user " + sub
            case .email: "email"
            }
            seen.withLockedValue { $0.append(name) }
            switch entry.action {
            case .session(let key, _): return key == "fails" ? .retry : .done
            case .notification(let body) where body == "verifies" && !keysDown.withLockedValue({ $0 }):
                return .replace(HeldQueueTests.user("u9", at: 5))
            case .notification: return keysDown.withLockedValue { $0 } ? .later : .drop
            case .user: return .done
            case .email: return .done
            }
        }
        await held.replay()
        #expect(seen.withLockedValue { $0 } == ["fails", "n1", "ok"], "past the failure; n2 and the last not asked once the keys failed")
        #expect(held.entries.map(\.action) == [actions[0], actions[1], actions[2], actions[4]])

        keysDown.withLockedValue { $0 = false }
        seen.withLockedValue { $0 = [] }
        await held.replay()
        #expect(seen.withLockedValue { $0 } == ["fails", "n1", "n2", "verifies", "user u9"], "verified, then applied in the same pass")
        #expect(held.entries.map(\.action) == [actions[0]], "n1 and n2 never verify: dropped")

        for action in [HeldRevocation.Action.session(key: "f2", sub: nil), .session(key: "fails2", sub: nil), .session(key: "ok2", sub: nil)] {
            _ = await held.hold(action, keep: 1, why: Refused())
        }
        held.setApply { entry in
            seen.withLockedValue { $0.append("\(entry.id)") }
            return .retry
        }
        seen.withLockedValue { $0 = [] }
        await held.replay()
        #expect(seen.withLockedValue { $0.count } == HeldRevocations.failuresInARow, "the store is failing again: the rest waits")
        #expect(held.count == 4)
    }

    @Test("a revocation that cannot be kept is refused, so the caller answers the store's failure: the journal not writable, or the unverified notifications' bound reached; nothing of it is denied or replayed")
    func refusals() async throws {
        let d = try Self.directory()
        defer { try? FileManager.default.removeItem(atPath: d) }
        let metrics = GatewayMetrics()
        let journal = try HeldJournal(directory: d)
        let held = try HeldRevocations(journal: journal, metrics: metrics, logger: Logger(label: "held"), now: { 0 })
        #expect(await held.hold(.session(key: "kept", sub: nil), keep: 1, why: Refused()))
        journal.close()  // from now on every write fails
        #expect(await held.hold(.session(key: "lost", sub: nil), keep: 1, why: Refused()) == false)
        #expect(!held.denies(key: "lost") && held.denies(key: "kept"))
        #expect(held.entries.map(\.action) == [.session(key: "kept", sub: nil)])

        let memory = try HeldRevocations(journal: nil, metrics: metrics, logger: Logger(label: "held"), now: { 0 })
        for i in 0..<HeldQueue.unverifiedCapacity { #expect(await memory.hold(.notification(body: "n\(i)"), keep: 1, why: Refused())) }
        #expect(await memory.hold(.notification(body: "one more"), keep: 1, why: Refused()) == false)
        #expect(await memory.hold(.session(key: "a logout", sub: nil), keep: 1, why: Refused()), "still room for what is not a notification")
        let exported = String(decoding: metrics.exposition(), as: UTF8.self)
        #expect(exported.contains(#"sessiongate_held_revocation_changes_total{result="refused"} 2"#), "\(exported.split(separator: "\n").filter { $0.contains("held") })")
        #expect(exported.contains("sessiongate_held_revocations 1001.0") && exported.contains("sessiongate_held_revocations_oldest_seconds 0.0"),
                "the README's gauges, as named there")
    }

    @Test("store.state_dir defaults to systemd's $STATE_DIRECTORY (the first of a list); the configuration's wins; neither: in memory")
    func stateDirectoryDefault() {
        #expect(HeldJournal.directory(configured: nil, environment: ["STATE_DIRECTORY": "/var/lib/sessiongate:/var/lib/other"]) == "/var/lib/sessiongate")
        #expect(HeldJournal.directory(configured: "/srv/held", environment: ["STATE_DIRECTORY": "/var/lib/sessiongate"]) == "/srv/held")
        #expect(HeldJournal.directory(configured: nil, environment: [:]) == nil)
    }

    static func directory() throws -> String {
        let d = NSTemporaryDirectory() + "held-\(UInt64.random(in: 0 ... .max))"
        try FileManager.default.createDirectory(atPath: d, withIntermediateDirectories: true)
        return d
    }

    @Test("the journal gives back what is held, in order, once each, without what was done; a record cut short is skipped and the next one is whole; the file is 0600")
    func journalRoundTrip() throws {
        let d = try Self.directory()
        defer { try? FileManager.default.removeItem(atPath: d) }
        var q = HeldQueue()
        var held: [HeldRevocation] = []
        for action in [HeldRevocation.Action.session(key: "k1", sub: "u1"), Self.user("u2", at: 5), .notification(body: #"{"payload":"a/b"}"#)] {
            guard case .held(let entry) = q.hold(action, keep: 7, now: 1) else { Issue.record("not held"); return }
            held.append(entry)
        }
        do {
            let journal = try HeldJournal(directory: d)
            #expect(try journal.load().isEmpty)
            for entry in held { try journal.append(.hold(entry)) }
            try journal.append(.done(held[0].id))
            journal.close()
        }
        // A crash mid-write (the record cut short), then a whole record after it.
        let handle = try #require(FileHandle(forWritingAtPath: d + "/" + HeldJournal.fileName))
        handle.seekToEndOfFile()
        handle.write(Data(("\n" + #"{"hold":{"_0":{"id":99,"rec"#).utf8))
        handle.write(Data("\n".utf8) + (try JSONEncoder().encode(HeldJournal.Line.done(held[1].id))))
        try handle.close()

        let journal = try HeldJournal(directory: d)
        #expect(try journal.load() == [held[2]])
        let mode = try #require(try FileManager.default.attributesOfItem(atPath: journal.path)[.posixPermissions] as? Int)
        #expect(mode == 0o600)
        var reloaded = HeldQueue(try journal.load())
        #expect(reloaded.hold(.session(key: "new", sub: nil), keep: 1, now: 2)
            == .held(HeldRevocation(id: held[2].id + 1, received: 2, keep: 1, action: .session(key: "new", sub: nil))),
                "ids go on after the last one kept")
        try journal.append(.hold(held[2]))  // written again (a hold racing a compaction): kept once
        #expect(try journal.load() == [held[2]])
        try journal.compact { [] }
        #expect(try String(contentsOfFile: journal.path, encoding: .utf8).isEmpty, "nothing held: an empty file")
        #expect(try journal.load().isEmpty)
    }

    @Test("a second process on the same state directory is refused with a clear reason; a directory that is not there too")
    func journalLock() throws {
        let d = try Self.directory()
        defer { try? FileManager.default.removeItem(atPath: d) }
        let first = try HeldJournal(directory: d)
        #expect { try HeldJournal(directory: d) } throws: { "\($0)".contains("in use by another sessiongate process") }
        first.close()
        _ = try HeldJournal(directory: d)
        #expect { try HeldJournal(directory: d + "/missing") } throws: { "\($0)".contains("is not a directory") }
    }
}

@Suite("Revocations held through a store outage, with real processes", .serialized, .timeLimit(.minutes(3)))
struct HeldRevocationTests {
    static let cookie = "__Host-sessiongate"

    @Test("a logout while Redis is frozen is answered done and refused here at once; once Redis answers it is applied and the other instance refuses the session too; nothing is retried by the client")
    func logoutDuringOutage() async throws {
        let logs = LogRecorder()
        try await SignInHarness.withOwnRedis(storeTimeout: .seconds(1), localCacheTTL: .seconds(3600), logs: logs) { h, redis in
            let b = try await h.addInstance()
            let browser = TestBrowser(gatewayOrigin: h.origin)
            _ = try await browser.signIn(from: "/x", as: h.simulator.createUser())
            let cookie = try #require(browser.cookies[Self.cookie])
            let onB = TestBrowser(gatewayOrigin: b.origin)
            onB.cookies[Self.cookie] = cookie
            #expect(try await onB.request("/x").status == 200, "B admits it (and caches it for an hour)")

            redis.freeze()
            let logout = try await browser.request("/_auth/logout", method: .POST, form: [])
            #expect(logout.status == 303, "held: the logout is done as far as the user is concerned: \(logout.status) \(logout.body.prefix(200))")
            let stale = TestBrowser(gatewayOrigin: h.origin)
            stale.cookies[Self.cookie] = cookie
            #expect(try await stale.request("/x").status == 302, "refused here at once, although the store still holds the session")
            #expect(try await h.metric("sessiongate_held_revocations") == "1.0")
            #expect(logs.all.contains { $0.contains("the session store did not take a revocation: held") && $0.contains("kind=logout") })
            #expect(!logs.all.contains { $0.contains(cookie) }, "no cookie in the log")

            redis.thaw()
            try await Poll.within(.seconds(10), "the held logout is applied") { logs.all.contains { $0.contains("a held revocation was applied") } }
            #expect(try await h.metric("sessiongate_held_revocations") == "0.0")
            #expect(try await h.metric(#"sessiongate_held_revocation_changes_total{result="applied"}"#) == "1")
            let onBAfter = try await firstTime(302, within: .seconds(5), every: .milliseconds(20)) { try await onB.request("/x").status }
            #expect(onBAfter != nil, "B refuses the session once the logout is applied (published to the fleet)")
            #expect(try await stale.request("/x").status == 302, "and so does A, from the store now")
        }
    }

    @Test("the user's disconnect (/_auth/revoke) while Redis is frozen, its session cached: answered done and refused at once; once Redis answers, revoked and its token revoked at Apple")
    func disconnectDuringOutage() async throws {
        let logs = LogRecorder()
        try await SignInHarness.withOwnRedis(storeTimeout: .seconds(1), localCacheTTL: .seconds(3600), logs: logs) { h, redis in
            let sub = h.simulator.createUser()
            let browser = TestBrowser(gatewayOrigin: h.origin)
            _ = try await browser.signIn(from: "/x", as: sub)
            #expect(try await browser.request("/x").status == 200)  // and cached here
            let revokes = h.simulator.requestCount("/auth/revoke")

            redis.freeze()
            let answer = try await browser.request("/_auth/revoke", method: .POST, headers: [("accept", "application/json")], form: [])
            #expect(answer.status == 204, "held: done for the user (\(answer.status) \(answer.body.prefix(200)))")
            #expect(try await browser.request("/x").status == 302, "refused here at once")
            #expect(h.simulator.requestCount("/auth/revoke") == revokes, "Apple is asked once the store has queued the tokens")

            redis.thaw()
            try await Poll.within(.seconds(10), "the held disconnect is applied") { logs.all.contains { $0.contains("a held revocation was applied") } }
            #expect(h.simulator.requestCount("/auth/revoke") > revokes)
            let tokens = DeletionTests.tokens(of: sub, at: h.simulator)
            #expect(!tokens.isEmpty && tokens.allSatisfy { $0.revoked }, "the token revoked at Apple: \(tokens)")
            #expect(try await browser.request("/x").status == 302, "ended in the store")
        }
    }

    @Test("Apple's consent-revoked while Redis is down, and another while Apple's keys are unreachable, are both answered 200 and take effect once each answers")
    func notificationsDuringOutage() async throws {
        let logs = LogRecorder()
        try await SignInHarness.withOwnRedis(storeTimeout: .seconds(1), localCacheTTL: .seconds(3600), logs: logs) { h, redis in
            let notifications = h.origin + "/_auth/apple/notifications"
            let (alice, bob, carol) = (h.simulator.createUser(), h.simulator.createUser(), h.simulator.createUser())
            var browsers: [String: TestBrowser] = [:]
            for sub in [alice, bob, carol] {
                let browser = TestBrowser(gatewayOrigin: h.origin)
                _ = try await browser.signIn(from: "/x", as: sub)
                #expect(try await browser.request("/x").status == 200)  // and cached here
                browsers[sub] = browser
            }
            // Redis restarted with its data (a snapshot first), down meanwhile.
            _ = try RedisCommand.send(["SAVE"], port: redis.port)
            redis.crash()
            let duringStore = await h.simulator.sendNotification(.consentRevoked, sub: alice, to: notifications, retryDelays: [])
            #expect(duringStore.status == 200 && duringStore.attempts == 1, "held, not refused: Apple's retries are not relied on (\(duringStore))")
            let aliceDuring = try await browsers[alice]!.request("/x")
            #expect(aliceDuring.status == 302, "the verified revocation is refused here at once: \(aliceDuring.status) \(logs.all.suffix(6))")

            // Apple's key rotated while its key endpoint fails: not verifiable yet, held too.
            _ = try h.simulator.rotateKeys()
            h.simulator.setFaults { $0.keysFailureStatus = 503 }
            let duringKeys = await h.simulator.sendNotification(.consentRevoked, sub: bob, to: notifications, retryDelays: [])
            #expect(duringKeys.status == 200, "kept and verified later, not refused: \(duringKeys)")
            #expect(try await h.metric("sessiongate_held_revocations") == "2.0")

            try redis.start()
            try await Poll.within(.seconds(10), "alice's notification is applied") { logs.all.contains { $0.contains("a held revocation was applied") } }
            #expect(try await browsers[carol]!.request("/x").status == 200, "the store came back with its data: others' sessions live on")
            #expect(try await browsers[alice]!.request("/x").status == 302)
            #expect(try await browsers[bob]!.request("/x").status == 200, "not verified yet: bob is not refused on its say-so")
            #expect(try await h.metric("sessiongate_held_revocations") == "1.0", "bob's waits for Apple's keys, behind nothing")

            h.simulator.setFaults { $0.keysFailureStatus = nil }
            let bobRefused = try await firstTime(302, within: .seconds(10), every: .milliseconds(200)) { try await browsers[bob]!.request("/x").status }
            #expect(bobRefused != nil, "verified once Apple's keys answer, then applied")
            // The store took it (bob is refused) just before the entry leaves the queue.
            try await Poll.within(.seconds(5), "nothing is held") { try await h.metric("sessiongate_held_revocations") == "0.0" }
            let again = await h.simulator.sendNotification(.consentRevoked, sub: bob, to: notifications, jti: duringKeys.jti, retryDelays: [])
            #expect(again.status == 200, "Apple's redelivery of an applied one: a duplicate, answered 200")
        }
    }

    @Test("with store.state_dir a logout held at shutdown is kept on disk: the next start refuses the session from the first request, and applies it once Redis answers")
    func keptAcrossRestart() async throws {
        let state = try HeldQueueTests.directory()
        defer { try? FileManager.default.removeItem(atPath: state) }
        let logs = LogRecorder()
        try await SignInHarness.withOwnRedis(storeTimeout: .seconds(1), localCacheTTL: .seconds(3600)) { h, redis in
            let b = try await h.addInstance(logs: logs) { $0.store.stateDir = state }
            let onA = TestBrowser(gatewayOrigin: h.origin)
            _ = try await onA.signIn(from: "/x", as: h.simulator.createUser())  // Apple returns to A's address
            let cookie = try #require(onA.cookies[Self.cookie])
            let onB = TestBrowser(gatewayOrigin: b.origin)
            onB.cookies[Self.cookie] = cookie
            #expect(try await onB.request("/x").status == 200)

            redis.freeze()
            #expect(try await onB.request("/_auth/logout", method: .POST, form: []).status == 303)
            await h.stopInstance(b.service)
            #expect(logs.all.contains { $0.contains("revocations still held at shutdown: kept in store.state_dir") })
            let journal = try String(contentsOfFile: state + "/" + HeldJournal.fileName, encoding: .utf8)
            #expect(journal.contains(#""session""#) && !journal.contains(cookie), "the store key is kept, never the session id")

            // The next start (Redis still frozen) refuses the session at once.
            let c = try await h.addInstance(logs: logs) { $0.store.stateDir = state }
            #expect(logs.all.contains { $0.contains("revocations held by the last run") })
            let onC = TestBrowser(gatewayOrigin: c.origin)
            onC.cookies[Self.cookie] = cookie
            #expect(try await onC.request("/x").status == 302, "refused before the store answers")

            redis.thaw()
            let cAdmin = try #require(c.service.adminAddress?.port)
            try await Poll.within(.seconds(10), "the held logout is applied") {
                try await h.metric("sessiongate_held_revocation_changes_total{result=\"applied\"}", port: cAdmin) == "1"
            }
            let onAAfter = try await firstTime(302, within: .seconds(5), every: .milliseconds(20)) { try await onA.request("/x").status }
            #expect(onAAfter != nil, "A, whose cache held the session for an hour, refuses it once the logout is applied")
            try await Poll.within(.seconds(5), "the journal is emptied") {
                (try? String(contentsOfFile: state + "/" + HeldJournal.fileName, encoding: .utf8))?.isEmpty == true
            }
        }
    }
}
