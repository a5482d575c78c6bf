import AppleIDSimulator
import Foundation
import GatewayConfig
import Logging
import NIOPosix
import Sessions
import TestSupport
import Testing

@testable import Gateway

/// What the app learns when a user's `sub` changes in an app transfer (issue 25 §1): a
/// `user.transferred` event, and during the transfer period `X-Auth-Former-User` and the
/// assertion's `former_sub`.
@Suite("A transferred user, as the app sees it", .serialized, .timeLimit(.minutes(3)))
struct TransferredUserTests {
    @Test("a client-sent X-Auth-Former-User never reaches the app, in any spelling, even with no identity prefix to strip")
    func formerUserHeaderIsStripped() async throws {
        try await SignInHarness.with(configure: { $0.identity.headerPrefix = "" }) { h in
            let browser = TestBrowser(gatewayOrigin: h.origin)
            _ = try await browser.signIn(from: "/x", as: h.simulator.createUser())
            let spoofs = [("X-Auth-Former-User", "000001.forged.0001"), ("x_auth_former_user", "000002.forged.0002")]
            #expect(try await browser.request("/x", headers: [("accept", "text/html")] + spoofs).status == 200)
            let seen = h.upstream.stats.withLockedValue { $0.lastHeaders }
            #expect(!seen.contains { $0.value.contains("forged") }, "\(seen.filter { $0.value.contains("forged") }.map(\.name))")
            #expect(seen["x-auth-user"].count == 1)
        }
    }
}

extension TransferredUserTests {
    @Test("X-Auth-Former-User is sent for the 60 days after the mapping, then no more", arguments: [
        ("just mapped", Int64(0), true),
        ("the transfer period's last millisecond", TransferArrival.period - 1, true),
        ("the period over", TransferArrival.period, false),
    ])
    func formerUserDuringTheTransferPeriod(_ moment: String, after elapsed: Int64, sent: Bool) {
        let mappedAt: Int64 = 1_800_000_000_000
        let user = UserProfile(sub: "000002.new.0002", formerSub: "000001.old.0001", transferredAt: mappedAt)
        let headers = Authenticator.identityHeaders(user, names: IdentityHeaderNames(), now: mappedAt + elapsed)
        #expect(headers.contains { $0 == ("X-Auth-Former-User", "000001.old.0001") } == sent, "\(moment)")
        #expect(headers.contains { $0 == ("X-Auth-User", "000002.new.0002") })
        let unmapped = UserProfile(sub: "000002.new.0002", formerSub: "000001.old.0001")
        #expect(!Authenticator.identityHeaders(unmapped, names: IdentityHeaderNames(), now: mappedAt).contains { $0.0 == "X-Auth-Former-User" },
                "no mapping time: never sent")
    }

    @Test("a user mapped by the import or at their first sign-in is announced as user.transferred, and their requests carry X-Auth-Former-User and the assertion's former_sub")
    func appLearnsTheMapping() async throws {
        let ledger = TransferLedger()
        let redis = try TestRedis.start()
        defer { redis.stop() }
        let prefix = TestRedis.uniquePrefix()  // one operator on both sides: the store knows the former subs
        try await EventReceiver.with { receiver in
            try await MigrationTests.withGateway(team: "TEAMA12345", ledger: ledger, redis: redis, prefix: prefix, admin: "nobody") { a in
                try await MigrationTests.withGateway(team: "TEAMB12345", ledger: ledger, redis: redis, prefix: prefix, admin: "nobody", events: receiver.url) { b in
                    try await withTeardown(try TransferExportTests.backend(a), stop: { await $0.shutdown() }) { backend in
                        let (batched, late) = (a.simulator.createUser(), a.simulator.createUser())
                        for sub in [batched, late] { _ = try await TestBrowser(gatewayOrigin: a.origin).signIn(from: "/x", as: sub) }
                        let file = a.directory + "/transfer.jsonl"
                        #expect(try await MigrationTests.migrating(a, store: backend.store) { try await $0.export(target: "TEAMB12345", to: file) }.exported == 2)
                        let records = try await backend.store.transfers(on: MultiThreadedEventLoopGroup.singleton.next()).get()
                        let (batchedID, lateID) = (try #require(records.first { $0.from == batched }?.id), try #require(records.first { $0.from == late }?.id))

                        // The app moves; the import (announcing as `migrate import` does) misses the late user.
                        SimulatedAppleID.transfer(from: a.simulator, to: b.simulator)
                        let batch = b.directory + "/batch.jsonl"
                        try String(contentsOfFile: file, encoding: .utf8).split(separator: "\n").filter { !$0.contains(lateID) }.joined(separator: "\n")
                            .write(toFile: batch, atomically: true, encoding: .utf8)
                        let events = try #require(b.service.core.events)
                        let report = try await Migration.with(configuration: b.configuration, store: backend.store, perSecond: 200, retryDelay: .milliseconds(10),
                                                              logger: Logger(label: "migration"), now: b.clock.now,
                                                              transferred: { events.transferred($0, reason: "import") }) { try await $0.importFile(batch) }
                        #expect(report.moved == 1, "\(report)")
                        let newBatched = try #require(a.simulator.counterpart(of: batched, at: b.simulator))
                        let newLate = try #require(a.simulator.counterpart(of: late, at: b.simulator))

                        let imported = try await AppEventsTests.verified(try #require(await receiver.waitFor(1).first), gateway: TestBrowser(gatewayOrigin: b.origin))
                        #expect(imported["type"] as? String == "user.transferred" && imported["reason"] as? String == "import")
                        #expect(imported["sub"] as? String == newBatched && imported["former_sub"] as? String == batched && imported["transfer_sub"] as? String == batchedID)

                        // The batched user signs in at B: the app sees who they were, in the header and the assertion.
                        let browser = TestBrowser(gatewayOrigin: b.origin)
                        _ = try await browser.signIn(from: "/x", as: newBatched)
                        #expect(try await browser.request("/x").status == 200)
                        #expect(MigrationTests.seen(b, "x-auth-user") == newBatched && MigrationTests.seen(b, "x-auth-former-user") == batched)
                        let assertion = try await Base64URLTest.verifiedClaims(try #require(MigrationTests.seen(b, "x-auth-assertion")), gateway: browser)
                        #expect(assertion["former_sub"] as? String == batched)
                        let info = try await browser.request("/_auth/userinfo", headers: [("accept", "application/json")])
                        #expect(info.body.contains(#""former_sub":"\#(batched)""#), "userinfo says it too: \(info.body)")

                        // The late user is mapped at their first sign-in, and announced then.
                        let lateBrowser = TestBrowser(gatewayOrigin: b.origin)
                        _ = try await lateBrowser.signIn(from: "/x", as: newLate)
                        #expect(try await lateBrowser.request("/x").status == 200)
                        #expect(MigrationTests.seen(b, "x-auth-former-user") == late)
                        let arrived = try await AppEventsTests.verified(try #require(await receiver.waitFor(2).last), gateway: lateBrowser)
                        #expect(arrived["type"] as? String == "user.transferred" && arrived["reason"] as? String == "sign_in")
                        #expect(arrived["sub"] as? String == newLate && arrived["former_sub"] as? String == late && arrived["transfer_sub"] as? String == lateID)

                        // A user who never moved carries no former sub.
                        let stranger = TestBrowser(gatewayOrigin: b.origin)
                        _ = try await stranger.signIn(from: "/x", as: b.simulator.createUser())
                        #expect(try await stranger.request("/x").status == 200)
                        #expect(MigrationTests.seen(b, "x-auth-former-user") == nil)
                        #expect(receiver.received.map(\.type) == ["user.transferred", "user.transferred"], "one event per user mapped")
                    }
                }
            }
        }
    }
}
