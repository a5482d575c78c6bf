import AppleIDSimulator
import Foundation
import GatewayConfig
import NIOPosix
import Sessions
import TestSupport
import Testing

@testable import Gateway

/// `sessiongate migrate import`, run as the operator runs it (issue 25 §1): a user Apple refused
/// is a user left behind, and the exit status says so.
@Suite("migrate import, the command (process)", .serialized, .timeLimit(.minutes(3)))
struct TransferImportCommandTests {
    /// The recipient's configuration file for `migrate`, as its operator writes it: `h`'s team,
    /// key and store, with events for the app.
    static func yaml(_ h: SignInHarness, redis: TestRedis, events: String) -> String {
        """
        server:
          listen: "127.0.0.1:0"
          admin_listen: "127.0.0.1:0"
          public_url: "\(h.origin)"
        apple:
          team_id: "\(h.configuration.apple!.teamID)"
          client_ids: ["\(SignInHarness.webClient)", "\(SignInHarness.appClient)"]
          key_id: "KEY1234567"
          private_key_file: "\(h.directory)/AuthKey.p8"
          base_url: "\(h.simulator.baseURL)"
        session:
          secret_file: "\(h.directory)/session.key"
        store:
          redis_url: "redis://\(redis.host):\(redis.port)/\(redis.database)"
          key_prefix: "\(h.configuration.store.keyPrefix)"
          timeout: "5s"
        identity:
          assertion:
            enabled: true
            key_file: "\(h.directory)/assertion.pem"
        events:
          url: "\(events)"
        routes:
          - name: app
            upstream: "http://\(h.configuration.routes[0].upstream.host):\(h.configuration.routes[0].upstream.port)"
        """
    }

    @Test("a line Apple refused is a user left behind: migrate import lists it and exits 3; the users it moved are announced to the app as user.transferred")
    func refusedLinesFailTheImport() async throws {
        let ledger = TransferLedger()
        let redis = try TestRedis.start()
        defer { redis.stop() }
        try await EventReceiver.with { receiver in
            try await MigrationTests.withGateway(team: "TEAMA12345", ledger: ledger, redis: redis, prefix: TestRedis.uniquePrefix(), admin: "nobody") { a in
                try await MigrationTests.withGateway(team: "TEAMB12345", ledger: ledger, redis: redis, prefix: TestRedis.uniquePrefix(), admin: "nobody",
                                                     events: receiver.url) { b in
                    let (stays, leaves) = (a.simulator.createUser(), a.simulator.createUser())
                    for sub in [stays, leaves] { _ = try await TestBrowser(gatewayOrigin: a.origin).signIn(from: "/x", as: sub) }
                    let file = a.directory + "/transfer.jsonl"
                    let ids = try await withTeardown(try TransferExportTests.backend(a), stop: { await $0.shutdown() }) { storeA in
                        #expect(try await MigrationTests.migrating(a, store: storeA.store) { try await $0.export(target: "TEAMB12345", to: file) }.exported == 2)
                        let records = try await storeA.store.transfers(on: MultiThreadedEventLoopGroup.singleton.next()).get()
                        return Dictionary(records.compactMap { r in r.from.map { ($0, r.id) } }, uniquingKeysWith: { a, _ in a })
                    }
                    let (stayingID, leftID) = (try #require(ids[stays]), try #require(ids[leaves]))

                    // The app moves; one user revokes their consent at the recipient before the import.
                    SimulatedAppleID.transfer(from: a.simulator, to: b.simulator)
                    b.simulator.revokeConsent(sub: try #require(a.simulator.counterpart(of: leaves, at: b.simulator)))
                    let config = b.directory + "/recipient.yaml"
                    try Self.yaml(b, redis: redis, events: receiver.url).write(toFile: config, atomically: true, encoding: .utf8)

                    try await GatewayProcess.with(arguments: ["migrate", "import", file, "--config", config, "--rate", "100"]) { process in
                        let status = await process.waitForExit()
                        await process.waitForOutputEnd()
                        let output = process.output
                        #expect(status == 3, "\(output)")
                        #expect(output.contains { $0.contains(leftID) && $0.contains("left behind") }, "the refused user is listed: \(output)")
                        #expect(!output.contains { $0.contains(stayingID) }, "the moved user is not: \(output)")
                    }

                    let event = try #require(await receiver.waitFor(1).first)
                    #expect(event.type == "user.transferred")
                    let claims = try await AppEventsTests.verified(event, gateway: TestBrowser(gatewayOrigin: b.origin))
                    #expect(claims["sub"] as? String == a.simulator.counterpart(of: stays, at: b.simulator))
                    #expect(claims["transfer_sub"] as? String == stayingID)
                    #expect(claims["former_sub"] == nil, "another operator's store never knew the sending team's sub")

                    // Run again: the refused user is still left behind; the moved one is not moved twice.
                    try await GatewayProcess.with(arguments: ["migrate", "import", file, "--config", config, "--rate", "100"]) { process in
                        #expect(await process.waitForExit() == 3)
                    }
                    #expect(receiver.received.count == 1, "one event per user moved")
                }
            }
        }
    }
}
