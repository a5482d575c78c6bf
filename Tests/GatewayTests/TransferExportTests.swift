import AppleIDSimulator
import Crypto
import Foundation
import GatewayConfig
import Logging
import NIOPosix
import Sessions
import TestSupport
import Testing

@testable import Gateway

/// `migrate export` (issue 25 §1): transfer ids belong to one recipient team, and the sending
/// team keeps its own `sub → transfer_sub` mapping beside the file it hands over.
@Suite("App transfer export (per target team)", .serialized, .timeLimit(.minutes(3)))
struct TransferExportTests {
    /// Another team Apple knows (it shares `ledger`), with no gateway: a target to export for.
    static func withTeam<T>(_ teamID: String, ledger: TransferLedger, _ body: (SimulatedAppleID) async throws -> T) async throws -> T {
        let simulator = try await SimulatedAppleID.start(team: .init(teamID: teamID, keys: ["KEY1234567": P256.Signing.PrivateKey().publicKey],
                                                                     clients: [SignInHarness.webClient: []]), ledger: ledger)
        return try await withTeardown(simulator, stop: { await $0.stop() }, body)
    }

    /// A store connection of its own to `h`'s Redis store, as `sessiongate migrate` makes it.
    static func backend(_ h: SignInHarness) throws -> RedisSessionBackend {
        try StoreConnection.backend(try #require(try StoreConnection.endpoint(h.configuration.store, commandTimeout: .seconds(5))), h.configuration.store,
                                    group: MultiThreadedEventLoopGroup.singleton, logger: Logger(label: "store"))
    }

    static func transferIDs(in file: String) throws -> [String] {
        try String(contentsOfFile: file, encoding: .utf8).split(separator: "\n").map { try TransferLine.parse(String($0)).get().transferSubject }
    }

    @Test("an export for another target team asks Apple again: each file holds its own team's ids, and the real recipient's import maps every user")
    func exportPerTarget() async throws {
        let ledger = TransferLedger()
        let redis = try TestRedis.start()
        defer { redis.stop() }
        try await MigrationTests.withGateway(team: "TEAMA12345", ledger: ledger, redis: redis, prefix: TestRedis.uniquePrefix(), admin: "nobody") { a in
            try await MigrationTests.withGateway(team: "TEAMC12345", ledger: ledger, redis: redis, prefix: TestRedis.uniquePrefix(), admin: "nobody") { c in
                try await Self.withTeam("TEAMB12345", ledger: ledger) { _ in
                    try await withTeardown((try Self.backend(a), try Self.backend(c)), stop: { await $0.0.shutdown(); await $0.1.shutdown() }) { stores in
                        let (storeA, storeC) = stores
                        let subs = [a.simulator.createUser(), a.simulator.createUser(email: "kim@example.org", privateEmail: false)]
                        for sub in subs { _ = try await TestBrowser(gatewayOrigin: a.origin).signIn(from: "/x", as: sub) }

                        // The operator first exports for a mistyped team (B), then for the real recipient (C).
                        let (forB, forC) = (a.directory + "/for-b.jsonl", a.directory + "/for-c.jsonl")
                        let (first, second, firstAgain) = try await MigrationTests.migrating(a, store: storeA.store) { exporter in
                            (try await exporter.export(target: "TEAMB12345", to: forB), try await exporter.export(target: "TEAMC12345", to: forC),
                             try await exporter.export(target: "TEAMB12345", to: forB))
                        }
                        #expect(first.exported == 2 && first.appleCalls == 2, "\(first)")
                        #expect(second.exported == 2 && second.appleCalls == 2, "a different target asks Apple again: \(second)")
                        #expect(firstAgain.alreadyInFile == 2 && firstAgain.appleCalls == 0, "each target's ids are kept for it: \(firstAgain)")
                        let (idsB, idsC) = (try Self.transferIDs(in: forB), try Self.transferIDs(in: forC))
                        #expect(Set(idsB).isDisjoint(with: idsC), "team C's file never holds team B's ids")

                        // The app moves to C: C's import maps both users, none refused.
                        SimulatedAppleID.transfer(from: a.simulator, to: c.simulator)
                        let report = try await MigrationTests.migrating(c, store: storeC.store) { try await $0.importFile(forC) }
                        #expect(report.moved == 2 && report.refused.isEmpty && report.failed.isEmpty, "\(report)")
                    }
                }
            }
        }
    }

    @Test("export writes the sending team's own sub → transfer_sub mapping beside the file, readable by its owner only, and never a sub into the file")
    func privateMapping() async throws {
        let ledger = TransferLedger()
        let redis = try TestRedis.start()
        defer { redis.stop() }
        try await MigrationTests.withGateway(team: "TEAMA12345", ledger: ledger, redis: redis, prefix: TestRedis.uniquePrefix(), admin: "nobody") { a in
            try await Self.withTeam("TEAMB12345", ledger: ledger) { _ in
                try await withTeardown(try Self.backend(a), stop: { await $0.shutdown() }) { storeA in
                    let subs = [a.simulator.createUser(), a.simulator.createUser()]
                    for sub in subs { _ = try await TestBrowser(gatewayOrigin: a.origin).signIn(from: "/x", as: sub) }
                    let file = a.directory + "/transfer.jsonl"
                    let mapping = file + ".mapping.jsonl"
                    // A second run (resumed) adds no line to either file.
                    _ = try await MigrationTests.migrating(a, store: storeA.store) { exporter in
                        (try await exporter.export(target: "TEAMB12345", to: file), try await exporter.export(target: "TEAMB12345", to: file))
                    }
                    let attributes = try FileManager.default.attributesOfItem(atPath: mapping)
                    #expect((attributes[.posixPermissions] as? NSNumber)?.intValue == 0o600)
                    let lines = try String(contentsOfFile: mapping, encoding: .utf8).split(separator: "\n").map {
                        try #require(try JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: String])
                    }
                    let ids = try Self.transferIDs(in: file)
                    #expect(lines.count == 2)
                    #expect(Set(lines.compactMap { $0["sub"] }) == Set(subs))
                    #expect(Set(lines.compactMap { $0["transfer_sub"] }) == Set(ids))
                    #expect(lines.allSatisfy { $0["target"] == "TEAMB12345" })
                    let text = try String(contentsOfFile: file, encoding: .utf8)
                    for sub in subs { #expect(!text.contains(sub), "the recipient's file never names a sub") }

                    // A file made for one team is never extended with another team's ids.
                    await #expect(throws: MigrationError.self) { try await MigrationTests.migrating(a, store: storeA.store) { try await $0.export(target: "TEAMC12345", to: file) } }
                }
            }
        }
    }
}

extension TransferExportTests {
    @Test("the recipient's checklist has it register its email sources for Apple's private email relay before the import (TN3159)")
    func checklistRegistersEmailSources() {
        let lines = TransferChecklist.lines(GatewayConfiguration(), progress: .failure(MigrationError("no store")))
        let register = lines.firstIndex { $0.contains("email sources") && $0.contains("private email relay") }
        let importing = lines.firstIndex { $0.contains("sessiongate migrate import") }
        #expect(register != nil && importing != nil && register! < importing!, "\(lines)")
        #expect(lines.contains { $0.contains("Sign in with Apple for Email Communication") })
    }
}
