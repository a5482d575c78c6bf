import GatewayConfig
import HTTPProxy
import Logging
import NIOConcurrencyHelpers

/// Configuration reloads (SIGHUP): the whole running configuration swapped as one value, or
/// nothing changed.
extension GatewayService {
    public enum ReloadOutcome: String, Sendable {
        /// The new configuration runs for every new request (dry: it would).
        case applied = "ok"
        /// The file has errors (or names an upstream that does not resolve): nothing changed.
        case invalid
        /// The file changes keys that apply only at restart: nothing changed.
        case refused
    }

    /// What a reload did (or, tried dry, would do): its outcome and the `file:line:col: error:`
    /// lines that explain it, as they were logged.
    public struct ReloadReport: Sendable {
        public let outcome: ReloadOutcome
        public let problems: [String]
        /// The file the gateway reads (its `--config`).
        public let file: String
    }

    /// Re-reads the configuration file and swaps the whole running configuration (routes, header
    /// rules, identity header names, allow lists, session lifetimes) as one value for new
    /// requests, or changes nothing: an invalid file, or one that changes a key of
    /// `ReloadRules.restartOnly`, keeps the running configuration, each reason logged with its
    /// `file:line:col`. With `dryRun`, everything but the swap runs (`check --reload` asks the
    /// running gateway through the admin listener), and nothing is logged or counted.
    /// Blocking (upstream names are resolved): never on an event loop.
    @discardableResult
    public func reload(dryRun: Bool = false) -> ReloadReport {
        guard let configPath else { return ReloadReport(outcome: .invalid, problems: ["the gateway runs without a configuration file"], file: "-") }
        if !dryRun { notifier.reloading() }
        // One reload at a time: the generation read, the checks and the swap are one step.
        let report = reloading.withLock { attemptReload(configPath, dryRun: dryRun) }
        guard !dryRun else { return report }
        switch report.outcome {
        case .applied:
            metrics.reloadsSucceeded.increment()
            // The store's name may have moved (a planned migration): followed now.
            if let backend = parts.resources.backend { Task { await backend.followName() } }
        case .invalid: metrics.reloadsFailed.increment()
        case .refused: metrics.reloadsRefused.increment()
        }
        notifier.ready(status: report.outcome == .applied ? "configuration reloaded"
            : "configuration reload \(report.outcome == .refused ? "refused" : "rejected"): the running configuration stays (\(report.problems.count) problem\(report.problems.count == 1 ? "" : "s"))")
        return report
    }

    /// Called with `reloading` held.
    private func attemptReload(_ configPath: String, dryRun: Bool) -> ReloadReport {
        var problems: [String] = []
        func log(_ problem: ConfigProblem) {
            problems.append("\(configPath):\(problem)")
            if !dryRun { logger.log(problem, file: configPath) }
        }
        func report(_ outcome: ReloadOutcome) -> ReloadReport { ReloadReport(outcome: outcome, problems: problems, file: configPath) }
        let result = GatewayConfiguration.load(file: configPath)
        for problem in result.problems { log(problem) }
        guard let next = result.configuration else {
            if !dryRun {
                logger.error("configuration reload rejected: the file has errors; the running configuration stays",
                             metadata: ["file": "\(configPath)", "errors": .stringConvertible(result.errors.count)])
            }
            return report(.invalid)
        }
        let (previous, generation) = running.withLockedValue { ($0.configuration, $0.auth.generation) }
        let refusal = ReloadRules.refusal(running: previous, next: next, locations: result.locations)
            + core.secrets.changed(in: next, locations: result.locations)
        guard refusal.isEmpty else {
            for problem in refusal { log(problem) }
            if !dryRun {
                logger.error("configuration reload refused: keys that apply only at restart changed; the running configuration stays",
                             metadata: ["file": "\(configPath)", "keys": "\(refusal.map(\.path).joined(separator: ","))"])
            }
            return report(.refused)
        }
        let auth: Authenticator
        let routing: RoutingSnapshot
        var certificate: TLSContexts.ServerCertificate? = nil
        do {
            // The certificate is re-read on every reload (certbot renews it in place).
            if let files = next.server.tls { certificate = try TLSContexts.server(files) }
            auth = try Authenticator(core: core, configuration: next, generation: generation + 1)
            routing = try Self.routing(next, auth)
        } catch {
            if let failure = error as? StartupFailure {
                log(failure.problem(locations: result.locations))
            } else {
                problems.append("\(configPath): \(error)")
                if !dryRun { logger.error("\(configPath): \(error)", metadata: ["file": .string(configPath)]) }
            }
            if !dryRun { logger.error("configuration reload rejected; the running configuration stays", metadata: ["file": "\(configPath)"]) }
            return report(.invalid)
        }
        guard !dryRun else { return report(.applied) }
        metrics.prime(routes: next.routes.map(\.name), upstreams: Self.upstreamLabels(next))
        running.withLockedValue { $0 = (next, auth) }
        proxy.replaceRouting(routing)
        if let tracing = next.tracing { core.tracer?.setSampleRatio(tracing.sampleRatio) }
        if let certificate {
            tls?.replace(certificate.context)
            metrics.recordCertificateExpiry(certificate.notValidAfter)
            if let warning = certificate.warning { logger.warning("server.tls.certificate_file: \(warning)") }
        }
        logger.info("configuration reloaded", metadata: ["file": "\(configPath)", "routes": .stringConvertible(next.routes.count)])
        return report(.applied)
    }
}
