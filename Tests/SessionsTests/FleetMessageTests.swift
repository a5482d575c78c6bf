import Testing

@testable import Sessions

/// The fleet's invalidation messages and the store's claim keys (DESIGN §3), as tables.
@Suite("Fleet messages codec and claim keys")
struct InvalidationTests {
    static let hash = String(repeating: "0f", count: 32)

    @Test("messages round-trip and keep their wire form", arguments: [
        (FleetMessage.user("001.abc"), "user 001.abc"),
        (FleetMessage.user("sub with spaces"), "user sub with spaces"),
        (FleetMessage.session(SessionHandle(key: hash)!), "session " + hash),
        (FleetMessage.validated(tokenHash: hash), "validated " + hash),
    ])
    func roundTrip(invalidation: FleetMessage, wire: String) {
        #expect(invalidation.payload == wire)
        #expect(FleetMessage(payload: Array(wire.utf8)) == invalidation)
    }

    @Test("anything else is no message", arguments: [
        "", "user ", "user", "session ", "session nothex", "session " + String(repeating: "0f", count: 31), "USER x", "link 001.abc", " user x", "validated ", "validated xyz",
    ])
    func junk(wire: String) {
        #expect(FleetMessage(payload: Array(wire.utf8)) == nil)
    }

    @Test("claim keys carry the hash tag of their subject", arguments: [
        (Claim.validation(tokenHash: "ab12"), "lock:validation:{ab12}"),
        (Claim.probe(clientID: "com.example.web"), "lock:probe:{com.example.web}"),
        (Claim.notification(jti: "j-1"), "notification:{j-1}"),
    ])
    func claimKeys(claim: Claim, key: String) {
        #expect(claim.name == key)
    }
}
