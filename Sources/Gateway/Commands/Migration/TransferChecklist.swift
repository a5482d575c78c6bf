import GatewayConfig
import NIOCore
import NIOPosix
import Sessions

/// `sessiongate check --transfer`: what an operator runs before, during and after an app
/// transfer, with where this store stands (Redis only: the memory store lives in the gateway).
public enum TransferChecklist {
    /// Where a store stands in a transfer.
    struct Progress: Equatable {
        var users = 0
        /// Users `migrate export` asked Apple about (records with a `from`).
        var exported = 0
        /// Lines `migrate import` loaded (records with `data`, or mapped: the mapping drops `data`).
        var loaded = 0
        /// Users mapped to their new `sub` (by the import or at sign-in).
        var mapped = 0
        /// The `allow.users` entries that still name a former sub, as instructions.
        var stale: [String] = []
    }

    /// - Parameter store: nil when there is none to read, with the reason.
    public static func lines(_ c: GatewayConfiguration, store: Result<any SessionStore, MigrationError>,
                             on loop: any EventLoop = MultiThreadedEventLoopGroup.singleton.next()) async -> [String] {
        switch store {
        case .failure(let reason): return lines(c, progress: .failure(reason))
        case .success(let store):
            do {
                return lines(c, progress: .success(try await progress(of: store, routes: c.routes, on: loop)))
            } catch {
                return lines(c, progress: .failure(MigrationError("the store did not answer: \(error)")))
            }
        }
    }

    /// What `store` holds of a transfer, and the entries of `routes` to replace.
    static func progress(of store: any SessionStore, routes: [GatewayConfiguration.Route], on loop: any EventLoop) async throws -> Progress {
        let users = try await store.users(on: loop).get(), records = try await store.transfers(on: loop).get()
        var stale: [String] = []
        for record in records {
            guard let from = record.from, let to = record.to else { continue }
            for route in routes where route.allow.users.contains(from) && !route.allow.users.contains(to) {
                stale.append("routes[\(route.name)].allow.users: replace \"\(from)\" with \"\(to)\"")
            }
        }
        return Progress(users: users.count, exported: records.filter { $0.from != nil }.count, loaded: records.filter { $0.data != nil || $0.to != nil }.count,
                        mapped: records.filter { $0.to != nil }.count, stale: stale.sorted())
    }

    /// The checklist's text, with `progress` where the store could be read.
    static func lines(_ c: GatewayConfiguration, progress: Result<Progress, MigrationError>) -> [String] {
        let team = c.apple?.teamID ?? "(no apple: section)"
        let (state, unavailable): (Progress?, String?) =
            switch progress {
            case .success(let progress): (progress, nil)
            case .failure(let reason): (nil, reason.description)
            }
        func status(_ text: String) -> String { state == nil ? "" : "   [\(text)]" }
        var lines = [
            "App transfer checklist (TN3159; README \"Existing accounts and app transfers\"). This configuration is team \(team).",
            unavailable.map { "(no progress shown: \($0))" } ?? "",
            "Before the transfer (or within the 60 days after): the sending team, with its own configuration",
            "  1. Ungroup the app from any Sign in with Apple app group (App Store Connect refuses the transfer otherwise).",
            "  2. sessiongate migrate export --config <sending team's file> --target <recipient Team ID> --out transfer.jsonl",
            "     Run it again until it reports no failures (users who revoked consent stay refused); it resumes.\(status("this store: \(state?.exported ?? 0) of \(state?.users ?? 0) users exported"))",
            "  3. Give transfer.jsonl to the recipient: it names users by transfer id only (no sub, no relay address). Keep",
            "     transfer.jsonl.mapping.jsonl (your sub → transfer id) to re-key your own data export; never give it away.",
            "During the 60 days after the transfer: the recipient",
            "  4. Its own apple: section (team_id, key_id, private_key_file) with the app's client_ids; sessiongate check --online.",
            "  5. Register the recipient's email sources for Apple's private email relay (Certificates, Identifiers & Profiles >",
            "     Services > Sign in with Apple for Email Communication: the domains and addresses the app sends mail from). Relay",
            "     users get new relay addresses with the transfer, and the relay delivers only mail from this team's registered",
            "     sources (TN3159): without them, mail to every relay user bounces.",
            "  6. sessiongate migrate import --config <recipient's file> transfer.jsonl",
            "     Run it again while it exits 2; exit 3 lists the users Apple refused (left behind). Put the allow.users entries it",
            "     prints in the file and reload (SIGHUP); the app hears user.transferred for each user mapped and re-keys its rows.\(status("this store: \(state?.mapped ?? 0) mapped of \(max(state?.loaded ?? 0, state?.mapped ?? 0)) loaded"))",
            "  7. What users see: their session ends once; they sign in with Apple again (no new consent screen) and reach the same",
            "     account. Anyone the import has not mapped yet is mapped at that sign-in (Apple's token carries transfer_sub).",
            "After day 60",
            "  8. Apple refuses every exchange and stops sending transfer_sub: a user never mapped arrives as a new user. Run the",
            "     import a last time before then.",
            "  9. Replace allow.users entries that still name a former sub (they keep matching the mapped user meanwhile).",
        ].filter { !$0.isEmpty }
        lines += (state?.stale ?? []).map { "     \($0)" }
        return lines
    }
}
