import AppleIDSimulator
import Foundation
import GatewayConfig
import Logging
import NIOPosix
import Sessions
import TestSupport
import Testing

@testable import Gateway

/// An app transfer (issue 14 §2) against two simulated teams sharing one ledger: users sign in
/// on team A, A exports, the app moves, B imports, users sign in on B.
@Suite("App transfer migration (two teams)", .serialized, .timeLimit(.minutes(3)))
struct MigrationTests {
    static let secret = String(repeating: "m1gr4te-", count: 5)

    /// A gateway of `team` on the shared Redis and key prefix, with the links API and an admin
    /// route whose allow list names `admin` (the operator's configuration, as it was before the
    /// transfer). With `events`, the app's events go there (signed with the assertion key).
    static func withGateway<T>(team: String, ledger: TransferLedger, redis: TestRedis, prefix: String, admin: String, events: String? = nil,
                               _ body: (SignInHarness) async throws -> T) async throws -> T {
        setenv("SG_TEST_MIGRATION_SECRET", secret, 1)
        return try await SignInHarness.with(store: .redis, redis: redis, assertion: events != nil, teamID: team, ledger: ledger, configure: { c in
            c.events.url = events
            c.store.keyPrefix = prefix
            c.identity.linksSecretFile = SecretReference.parse("env:SG_TEST_MIGRATION_SECRET")
            var allow = GatewayConfiguration.Allow()
            allow.users = [admin]
            c.routes.insert(.init(name: "admin", pathPrefix: "/admin/", upstream: c.routes[0].upstream, auth: .required, allow: allow, unauthenticated: .deny), at: 0)
        }, body)
    }

    static func link(_ h: SignInHarness, _ sub: String, _ account: String) async throws {
        let app = TestBrowser(gatewayOrigin: h.origin)
        let answer = try await app.request("/_auth/links", method: .POST, headers: [("accept", "application/json"), ("authorization", "Bearer \(secret)")],
                                           json: #"{"sub":"\#(sub)","account":"\#(account)"}"#, sendCookies: false)
        #expect(answer.status == 200)
    }

    /// What the app behind `h` saw on the last request.
    static func seen(_ h: SignInHarness, _ name: String) -> String? { h.upstream.stats.withLockedValue { $0.lastHeaders }.first(name: name) }

    /// Runs `body` with a migration as `sessiongate migrate` makes it, on `h`'s configuration
    /// and clock.
    static func migrating<T>(_ h: SignInHarness, store: any SessionStore, publish: @escaping @Sendable (FleetMessage) async -> Void = { _ in },
                             _ body: (Migration) async throws -> T) async throws -> T {
        try await Migration.with(configuration: h.configuration, store: store, perSecond: 200, retryDelay: .milliseconds(10), logger: Logger(label: "migration"),
                                 now: h.clock.now, publish: publish, body)
    }

    /// Team A's and team B's gateways on one Redis and key prefix (one operator's store), with a
    /// connection of its own to that store, as the CLI's.
    static func withTwoTeams(admin: String, _ body: (SignInHarness, SignInHarness, RedisSessionBackend) async throws -> Void) async throws {
        let ledger = TransferLedger()
        let redis = try TestRedis.start()
        defer { redis.stop() }
        let prefix = TestRedis.uniquePrefix()
        try await withGateway(team: "TEAMA12345", ledger: ledger, redis: redis, prefix: prefix, admin: admin) { a in
            try await withGateway(team: "TEAMB12345", ledger: ledger, redis: redis, prefix: prefix, admin: admin) { b in
                let endpoint = try #require(try StoreConnection.endpoint(a.configuration.store, commandTimeout: .seconds(5)))
                try await withTeardown(try StoreConnection.backend(endpoint, a.configuration.store, group: MultiThreadedEventLoopGroup.singleton, logger: Logger(label: "store")), stop: { await $0.shutdown() }) { backend in
                    try await body(a, b, backend)
                }
            }
        }
    }

    @Test("sign in on team A, export, transfer, import on team B, sign in on B: same accounts, same allow-list decisions; a user not in the batch is mapped at sign-in")
    func fullMigration() async throws {
        let adminA = "000001.aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.0001"
        try await Self.withTwoTeams(admin: adminA) { a, b, backend in
            let loop = MultiThreadedEventLoopGroup.singleton.next()

            // Team A: four users sign in; three are linked; the admin route admits one.
            let users: [(name: String, sub: String, account: String?)] = [
                ("admin", a.simulator.createUser(sub: adminA), "acct-admin"),
                ("relay", a.simulator.createUser(), "acct-1"),
                ("real", a.simulator.createUser(email: "real@example.org", privateEmail: false), nil),
                ("late", a.simulator.createUser(), "acct-late"),
            ]
            var browsersA: [String: TestBrowser] = [:]
            var decisions: [String: (admin: Int, account: String?)] = [:]
            for user in users {
                let browser = TestBrowser(gatewayOrigin: a.origin)
                _ = try await browser.signIn(from: "/x", as: user.sub)
                if let account = user.account { try await Self.link(a, user.sub, account) }
                browsersA[user.name] = browser
                let admin = try await browser.request("/admin/x", headers: [("accept", "application/json")]).status
                #expect(try await browser.request("/x").status == 200)
                decisions[user.name] = (admin, Self.seen(a, "x-auth-account"))
            }
            #expect(decisions["admin"]?.admin == 200 && decisions["relay"]?.admin == 403)
            #expect(decisions["relay"]?.account == "acct-1" && decisions["real"]?.account == nil)

            // Export (team A's key), then again: resumable, no second call to Apple.
            let file = a.directory + "/transfer.jsonl"
            let (exported, again, exportTime) = try await Self.migrating(a, store: backend.store) { exporter in
                let started = ContinuousClock.now
                let exported = try await exporter.export(target: "TEAMB12345", to: file)
                let exportTime = ContinuousClock.now - started
                let again = try await exporter.export(target: "TEAMB12345", to: file)
                await #expect(throws: MigrationError.self) { try await exporter.export(target: "not-a-team", to: file) }
                return (exported, again, exportTime)
            }
            #expect(exported.exported == 4 && exported.appleCalls == 4 && exported.refused.isEmpty && exported.failed.isEmpty, "\(exported)")
            #expect(again.exported == 0 && again.alreadyInFile == 4 && again.appleCalls == 0, "\(again)")
            let text = try String(contentsOfFile: file, encoding: .utf8)
            #expect(text.split(separator: "\n").count == 4)
            for user in users { #expect(!text.contains(user.sub), "the file never names a sub of team A (TN3159)") }
            #expect(!text.contains("privaterelay"), "nor a relay address")
            #expect(text.contains("real@example.org") && text.contains(#""routes":["admin"]"#))

            // The app moves to team B; B's import misses the "late" user (a batch cut short).
            SimulatedAppleID.transfer(from: a.simulator, to: b.simulator)
            let lateID = try #require(try await backend.store.transfers(on: loop).get().first { $0.from == users[3].sub }?.id)
            let batch = b.directory + "/batch.jsonl"
            try text.split(separator: "\n").filter { !$0.contains(lateID) }.joined(separator: "\n").write(toFile: batch, atomically: true, encoding: .utf8)
            // Team B's clock stops: every mapping (the import's, the sign-in's) is recorded at its time.
            b.clock.freeze()
            let mappedAt = b.clock.now()
            let (imported, importTime, rerun) = try await Self.migrating(b, store: backend.store, publish: { message in try? await backend.publish(message, on: loop).get() }) { importer in
                let importStarted = ContinuousClock.now
                let imported = try await importer.importFile(batch)
                let importTime = ContinuousClock.now - importStarted
                return (imported, importTime, try await importer.importFile(batch))
            }
            let newAdmin = try #require(a.simulator.counterpart(of: adminA, at: b.simulator))
            #expect(imported.moved == 3 && imported.sessionsEnded == 3 && imported.linksMoved == 2 && imported.appleCalls == 3, "\(imported)")
            #expect(imported.allowListChanges == ["admin": [AllowListChange(sub: newAdmin, replaces: adminA)]])
            #expect(imported.summary.contains { $0.contains(newAdmin) && $0.contains("replaces \"\(adminA)\"") })
            let checklist = await TransferChecklist.lines(b.configuration, store: .success(backend.store))
            #expect(checklist.contains { $0.contains("[this store: 3 mapped of 3 loaded]") }, "\(checklist)")
            #expect(checklist.contains { $0.contains("routes[admin].allow.users: replace \"\(adminA)\" with \"\(newAdmin)\"") })
            #expect(rerun.moved == 0 && rerun.alreadyMapped == 3 && rerun.appleCalls == 0, "\(rerun)")

            let adminID = try #require(try await backend.store.transfers(on: loop).get().first { $0.from == adminA }?.id)
            #expect(try await backend.store.transfer(adminID, on: loop).get()?.mappedAt == mappedAt, "mapped at team B's clock")

            // The old sessions are over (their refresh tokens belong to team A)…
            for user in users.prefix(3) {
                let old = try await browsersA[user.name]!.request("/api/x", headers: [("accept", "application/json")])
                #expect(old.status == 401 && old.headers.first(name: "x-sessiongate-session-ended") == "transferred", "\(user.name)'s team-A session: \(old.body)")
            }
            // …and on team B each user finds the same account and the same allow-list decision.
            for user in users {
                let newSub = try #require(a.simulator.counterpart(of: user.sub, at: b.simulator))
                let browser = TestBrowser(gatewayOrigin: b.origin)
                _ = try await browser.signIn(from: "/x", as: newSub)
                #expect(try await browser.request("/x").status == 200)
                #expect(Self.seen(b, "x-auth-user") == newSub)
                #expect(Self.seen(b, "x-auth-account") == decisions[user.name]?.account, "\(user.name): the same legacy account")
                #expect(try await browser.request("/admin/x", headers: [("accept", "application/json")]).status == decisions[user.name]?.admin, "\(user.name): the same allow-list decision")
            }
            #expect(Self.seen(b, "x-auth-account") == "acct-late", "the user the batch missed was mapped at sign-in")
            let lateOld = try await browsersA["late"]!.request("/api/x", headers: [("accept", "application/json")])
            #expect(lateOld.status == 401 && lateOld.headers.first(name: "x-sessiongate-session-ended") == "transferred", "and their old session ended then")
            let late = try await backend.store.transfer(lateID, on: loop).get()
            #expect(late?.to == a.simulator.counterpart(of: users[3].sub, at: b.simulator))
            #expect(late?.mappedAt == mappedAt, "at the gateway's clock")
            #expect(try await backend.store.profile(of: users[1].sub, on: loop).get() == nil, "the old identities are forgotten")
            print("migration: export of 4 users in \(exportTime) (4 Apple calls), import of 3 in \(importTime) (3 calls + 1 token), 1 mapped at sign-in")
        }
    }

    @Test("an access token Apple kills before its expires_in is renewed: the export reports no user refused, and a user who did revoke is still refused")
    func deadAccessToken() async throws {
        try await Self.withTwoTeams(admin: "none") { a, _, backend in
            let subs = [a.simulator.createUser(), a.simulator.createUser()]
            for sub in subs { _ = try await TestBrowser(gatewayOrigin: a.origin).signIn(from: "/x", as: sub) }
            a.simulator.setFaults { $0.deadMigrationTokens = 1 }
            let file = a.directory + "/transfer.jsonl"
            let report = try await Self.migrating(a, store: backend.store) { try await $0.export(target: "TEAMB12345", to: file) }
            #expect(report.exported == 2 && report.refused.isEmpty && report.failed.isEmpty, "\(report)")
            #expect(report.appleCalls == 3, "the refused call asked once more with a new token: \(report)")

            // A real refusal stays one: the user revoked consent (asked once more with a new token, then reported).
            let gone = a.simulator.createUser()
            _ = try await TestBrowser(gatewayOrigin: a.origin).signIn(from: "/x", as: gone)
            a.simulator.revokeConsent(sub: gone)
            let again = try await Self.migrating(a, store: backend.store) { try await $0.export(target: "TEAMB12345", to: file) }
            #expect(again.refused == [gone] && again.alreadyInFile == 2 && again.appleCalls == 2, "\(again)")
        }
    }

    @Test("an import into another operator's store: the file's link, name and email arrive; the report names the allow-list entries to add")
    func importElsewhere() async throws {
        let ledger = TransferLedger()
        let redis = try TestRedis.start()
        defer { redis.stop() }
        try await Self.withGateway(team: "TEAMA12345", ledger: ledger, redis: redis, prefix: TestRedis.uniquePrefix(), admin: "000002.bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb.0002") { a in
            try await Self.withGateway(team: "TEAMB12345", ledger: ledger, redis: redis, prefix: TestRedis.uniquePrefix(), admin: "nobody") { b in
                func backend(_ h: SignInHarness) throws -> RedisSessionBackend {
                    try StoreConnection.backend(try #require(try StoreConnection.endpoint(h.configuration.store, commandTimeout: .seconds(5))), h.configuration.store,
                                                group: MultiThreadedEventLoopGroup.singleton, logger: Logger(label: "store"))
                }
                try await withTeardown((try backend(a), try backend(b)), stop: { await $0.0.shutdown(); await $0.1.shutdown() }) { stores in
                    let (storeA, storeB) = stores

                    let sub = a.simulator.createUser(email: "pat@example.org", privateEmail: false, firstName: "Pat", sub: "000002.bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb.0002")
                    _ = try await TestBrowser(gatewayOrigin: a.origin).signIn(from: "/x", as: sub)
                    try await Self.link(a, sub, "acct-pat")
                    let file = a.directory + "/transfer.jsonl"
                    #expect(try await Self.migrating(a, store: storeA.store) { try await $0.export(target: "TEAMB12345", to: file) }.exported == 1)

                    SimulatedAppleID.transfer(from: a.simulator, to: b.simulator)
                    let report = try await Self.migrating(b, store: storeB.store) { try await $0.importFile(file) }
                    let newSub = try #require(a.simulator.counterpart(of: sub, at: b.simulator))
                    #expect(report.moved == 1 && report.sessionsEnded == 0 && report.linksMoved == 1)
                    #expect(report.allowListChanges == ["admin": [AllowListChange(sub: newSub, replaces: nil)]], "B's config never named the old sub: add the new one")
                    let browser = TestBrowser(gatewayOrigin: b.origin)
                    _ = try await browser.signIn(from: "/x", as: newSub)
                    #expect(try await browser.request("/x").status == 200)
                    #expect(Self.seen(b, "x-auth-account") == "acct-pat")
                    #expect(Self.seen(b, "x-auth-email") == "pat@example.org")
                    #expect(try await browser.request("/admin/x", headers: [("accept", "application/json")]).status == 403, "until the operator adds the entry the report printed")

                    // A malformed file changes nothing and names its line: not JSON, no id, an account id
                    // no header may carry.
                    for bad in ["not json", #"{"account":"a"}"#, #"{"transfer_sub":"y","account":"bad\u0001"}"#] {
                        try "{\"transfer_sub\":\"x\"}\n\(bad)\n".write(toFile: b.directory + "/bad.jsonl", atomically: true, encoding: .utf8)
                        await #expect(throws: MigrationError.self, "\(bad)") { try await Self.migrating(b, store: storeB.store) { try await $0.importFile(b.directory + "/bad.jsonl") } }
                    }
                    #expect(try await storeB.store.transfer("x", on: MultiThreadedEventLoopGroup.singleton.next()).get() == nil)

                    // A migration needs the configuration's Apple key, as one of its client ids.
                    var keyless = b.configuration
                    keyless.apple = nil
                    await #expect(throws: MigrationError.self) { try await Migration.with(configuration: keyless, store: storeB.store, logger: Logger(label: "migration")) { _ in } }
                    await #expect(throws: MigrationError.self) {
                        try await Migration.with(configuration: b.configuration, store: storeB.store, clientID: "com.example.other", logger: Logger(label: "migration")) { _ in }
                    }
                }
            }
        }
    }
}
