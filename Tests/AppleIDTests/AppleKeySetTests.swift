import AsyncHTTPClient
import Crypto
import Logging
import NIOCore
import NIOPosix
import Testing

@testable import AppleID
@testable import AppleIDSimulator

@Suite("Apple key set against the simulator (real HTTP)", .serialized)
struct AppleKeySetTests {
    static func withSimulator(_ body: (SimulatedAppleID, HTTPClient) async throws -> Void) async throws {
        let team = SimulatedAppleID.Team(teamID: "DEF123GHIJ", keys: ["ABC123DEFG": P256.Signing.PrivateKey().publicKey])
        let simulator = try await SimulatedAppleID.start(team: team)
        let client = HTTPClient(eventLoopGroupProvider: .shared(MultiThreadedEventLoopGroup.singleton))
        do {
            try await body(simulator, client)
        } catch {
            try? await client.shutdown()
            await simulator.stop()
            throw error
        }
        try await client.shutdown()
        await simulator.stop()
    }

    static func keySet(_ simulator: SimulatedAppleID, _ client: HTTPClient, cacheTTL: TimeAmount = .minutes(5), refetchInterval: TimeAmount = .seconds(30)) -> AppleKeySet {
        AppleKeySet(baseURL: simulator.baseURL, httpClient: client, cacheTTL: cacheTTL, unknownKeyRefetchInterval: refetchInterval, logger: Logger(label: "test"))
    }

    @Test("every published key is found; an unknown kid is never answered with another key")
    func publishedKeys() async throws {
        try await Self.withSimulator { simulator, client in
            let keys = Self.keySet(simulator, client)
            for kid in simulator.publishedKeyIDs { _ = try await keys.key(for: kid) }
            #expect(await keys.keyIDs == simulator.publishedKeyIDs.sorted())
            await #expect(throws: AppleKeySetError.unknownKey("nope")) { try await keys.key(for: "nope") }
            #expect(simulator.requestCount("/auth/keys") == 2, "one fetch, then one refetch for the unknown kid")
        }
    }

    @Test("a rotated key is picked up by one immediate refetch; further unknown kids wait for the interval")
    func rotation() async throws {
        try await Self.withSimulator { simulator, client in
            let keys = Self.keySet(simulator, client)
            _ = try await keys.key(for: simulator.publishedKeyIDs[0])
            let rotated = try simulator.rotateKeys()
            _ = try await keys.key(for: rotated)
            #expect(simulator.requestCount("/auth/keys") == 2)
            let again = try simulator.rotateKeys()
            await #expect(throws: AppleKeySetError.unknownKey(again)) { try await keys.key(for: again) }
            #expect(simulator.requestCount("/auth/keys") == 2, "rate-limited: no third fetch within the interval")
        }
    }

    @Test("a key rotated while the key endpoint fails is unavailable, never unknown; found by a refetch once it answers")
    func rotationDuringOutage() async throws {
        try await Self.withSimulator { simulator, client in
            let keys = AppleKeySet(baseURL: simulator.baseURL, httpClient: client, unknownKeyRefetchInterval: .seconds(30),
                                   failedRefetchInterval: .seconds(30), logger: Logger(label: "test"))
            _ = try await keys.key(for: simulator.publishedKeyIDs[0])
            let rotated = try simulator.rotateKeys()
            simulator.setFaults { $0.keysFailureStatus = 503 }
            await #expect(throws: AppleKeySetError.unavailable) { try await keys.key(for: rotated) }
            await #expect(throws: AppleKeySetError.unavailable, "still unknowable within the interval") { try await keys.key(for: rotated) }
            #expect(simulator.requestCount("/auth/keys") == 2, "one refetch for the new kid, not one per token")
            simulator.setFaults { $0.keysFailureStatus = nil }
            let retrying = AppleKeySet(baseURL: simulator.baseURL, httpClient: client, cacheTTL: .minutes(5), unknownKeyRefetchInterval: .seconds(30),
                                       failedRefetchInterval: .zero, logger: Logger(label: "test"))
            _ = try await retrying.key(for: simulator.publishedKeyIDs[0])
            simulator.setFaults { $0.keysFailureStatus = 503 }
            let next = try simulator.rotateKeys()
            await #expect(throws: AppleKeySetError.unavailable) { try await retrying.key(for: next) }
            simulator.setFaults { $0.keysFailureStatus = nil }
            _ = try await retrying.key(for: next)  // a failed refetch does not hold the next one back for the whole interval
        }
    }

    @Test("concurrent lookups of a new kid share one fetch")
    func singleFlight() async throws {
        try await Self.withSimulator { simulator, client in
            let keys = Self.keySet(simulator, client)
            _ = try await keys.key(for: simulator.publishedKeyIDs[0])
            let rotated = try simulator.rotateKeys()
            try await withThrowingTaskGroup(of: Void.self) { group in
                for _ in 0..<20 { group.addTask { _ = try await keys.key(for: rotated) } }
                try await group.waitForAll()
            }
            #expect(simulator.requestCount("/auth/keys") == 2)
        }
    }

    @Test("when Apple cannot be reached, the last good set stays in use")
    func lastGoodSet() async throws {
        try await Self.withSimulator { simulator, client in
            let keys = Self.keySet(simulator, client, cacheTTL: .zero)
            let kid = simulator.publishedKeyIDs[0]
            _ = try await keys.key(for: kid)
            await simulator.stop()
            _ = try await keys.key(for: kid)
            #expect(await keys.keyIDs.contains(kid))
        }
    }

    @Test("never fetched and unreachable: unavailable, not a default key")
    func unavailable() async throws {
        let client = HTTPClient(eventLoopGroupProvider: .shared(MultiThreadedEventLoopGroup.singleton))
        let keys = AppleKeySet(baseURL: "http://127.0.0.1:1", httpClient: client, timeout: .milliseconds(300), logger: Logger(label: "test"))
        await #expect(throws: AppleKeySetError.unavailable) { try await keys.key(for: "any") }
        try await client.shutdown()
    }
}
