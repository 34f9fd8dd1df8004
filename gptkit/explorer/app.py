"""The explorer: a local web page over the runs in a folder, where a learner watches a model write token by token and
sees where every number comes from: the candidates for each token, every head's attention, what each layer would
predict (the logit lens), how surprised the model is by a text, the features of an SAE trained on the run, and how
its heads formed over training (the run's timeline, and its weights at the steps it keeps). A FastAPI app;
explore.py serves it.

Every number comes from the model's own forward pass (gptkit.interp.hooks) and its own sampler
(gptkit.sampling.decoding): the page does no model arithmetic."""

import mimetypes
import sys
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from gptkit.base.errors import UserError, first_line
from gptkit.data.conversations import typed
from gptkit.explorer.answers import (GenerateRequest, MapRequest, PositionRequest, ReadRequest, attention_map,
                                     chat_ids, checked_ids, encode, generation_events, picked, position_report,
                                     read_text, run_metrics, sse)
from gptkit.explorer.experiment_answers import (FEATURE_NAME, ScoresRequest, head_scores_at, heads_report, lab_curves,
                                                off_of)
from gptkit.explorer.feature_answers import (FeatureRequest, TokenFeaturesRequest, feature_report, sae_hooks,
                                             sae_report, token_features)
from gptkit.explorer.guard import Guard, own_names
from gptkit.explorer.runs import ApiError, lab_rung, shown
from gptkit.explorer.timeline_answers import checked_checkpoint, timeline_report
from gptkit.run.checkpoint import load_checkpoint

STATIC = Path(__file__).resolve().parent / "static"


def body_refused(e):
    """The one line for a request body FastAPI could not parse (it raises HTTPException from the cause)."""
    cause = e.__cause__
    if isinstance(cause, UnicodeDecodeError):
        return f"the request body is not UTF-8 text ({cause.reason} at byte {cause.start}); send JSON"
    if isinstance(cause, RecursionError):
        return "the request body is nested too deeply to read; send the JSON the page sends"
    if isinstance(cause, ValueError) and "integer string conversion" in str(cause):  # Python's int() refused it
        return (f"the request body holds a number of more than {sys.get_int_max_str_digits()} digits; send the JSON "
                "the page sends")
    return f"the request body could not be read ({first_line(cause)}); send JSON" if cause else str(e.detail)


def make_app(shelf, host="127.0.0.1", port=8000, bound=None):
    """The explorer's FastAPI app over a Shelf of runs, answering at port on the names of host, the address it is
    bound to (bound, default host) and this machine's loopback (see gptkit/explorer/guard.py)."""
    app = FastAPI(title="gptkit explorer", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(Guard, names=own_names(host, bound or host), port=port)
    mimetypes.add_type("text/javascript", ".js")  # modules run only if served so; Windows may map .js otherwise
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    add_error_handlers(app)

    @app.get("/")
    def index():
        return FileResponse(STATIC / "index.html")

    @app.get("/api/runs")
    def runs():
        found = [s.to_json() for s in shelf.summaries()]
        # the lab's rungs in the order of its path, as its table lists them; other runs by name, after them
        found.sort(key=lambda r: (r["rung"] is None, r["rung"]["step"] if r["rung"] else 0, r["name"]))
        return {"root": shelf.root_name, "runs": found}

    # a run's name is one folder's name, never a path: any character but '/' (a newline too) reaches it
    @app.get("/api/runs/{name}/metrics")
    def metrics(name: str):
        return run_metrics(shelf.summary(name))

    @app.get("/api/runs/{name}")
    def pick(name: str):
        loaded = shelf.get(name)
        return dict(picked(name, loaded), saes=sae_hooks(loaded.summary.folder, loaded.model))

    @app.post("/api/generate")
    def generate(req: GenerateRequest):
        loaded = shelf.get(req.run, req.checkpoint)
        ids = chat_ids(loaded, req.prompt) if req.chat else encode(loaded, typed(loaded.tok, req.prompt))
        off = off_for(shelf, loaded, req.off)
        return StreamingResponse(sse(generation_events(shelf, loaded, ids, req, off)), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    @app.post("/api/read")
    def read(req: ReadRequest):
        loaded = shelf.get(req.run, req.checkpoint)
        off = off_for(shelf, loaded, req.off)
        answer = read_text(shelf, loaded, req.text, off)
        if off.names:  # and the intact model's reading, for the difference token by token
            answer["intact"] = read_text(shelf, loaded, req.text)
        return answer

    @app.post("/api/position")
    def position(req: PositionRequest):
        loaded = shelf.get(req.run, req.checkpoint)
        return position_report(shelf, loaded, req, off_for(shelf, loaded, req.off))

    @app.post("/api/attention_map")
    def head_map(req: MapRequest):
        loaded = shelf.get(req.run, req.checkpoint)
        return attention_map(shelf, loaded, req, off_for(shelf, loaded, req.off))

    add_experiment_routes(app, shelf)
    add_feature_routes(app, shelf)
    return app


def off_for(shelf, loaded, names):
    """What a request's "off" switches off in a loaded run: its features from the SAEs the shelf keeps. An SAE reads
    the run's own weights, which it was trained on: at a snapshot, a feature switched off is refused."""
    if loaded.at and any(FEATURE_NAME.fullmatch(n) for n in names):
        raise ApiError(400, f"a feature belongs to the run's own checkpoint, whose activations its SAE was trained "
                            f"on, not to {loaded.at}'s: switch the features back on to look at {loaded.at}")
    return off_of(loaded.model, names, lambda hook: shelf.sae(loaded, hook))


def add_experiment_routes(app, shelf):
    """The experiments' own routes (gptkit/explorer/experiment_answers.py): heads' labels (at a checkpoint the query
    names, ?checkpoint=iter:1200), one head's scores, the lab, and a run's timeline
    (gptkit/explorer/timeline_answers.py)."""

    @app.get("/api/runs/{name}/heads")
    def labels(name: str, checkpoint: str | None = None):
        loaded = shelf.get(name, None if checkpoint is None else checked_checkpoint(checkpoint))
        with shelf.lock:
            return heads_report(loaded.model, loaded.tok, lambda: load_checkpoint(loaded.summary.checkpoint))

    @app.post("/api/scores")
    def scores(req: ScoresRequest):
        loaded = shelf.get(req.run, req.checkpoint)
        idx, off = checked_ids(loaded, req.ids), off_for(shelf, loaded, req.off)
        with shelf.lock, off.on(loaded.model):
            return dict(head_scores_at(loaded.model, idx, req.layer, req.head, req.position), off=off.to_json())

    @app.get("/api/lab")
    def lab():
        def metrics(summary):
            try:
                return run_metrics(summary)
            except ApiError as e:
                return str(e)
        rungs = [(s, lab_rung(s.folder)) for s in shelf.summaries() if not s.error]
        return {"runs": lab_curves([(shown(s.name), rung, metrics(s)) for s, rung in rungs if rung])}

    @app.get("/api/runs/{name}/timeline")
    def timeline(name: str):
        return timeline_report(shelf.summary(name))


def add_feature_routes(app, shelf):
    """The features' routes (gptkit/explorer/feature_answers.py): an SAE of a run, a token's features, one feature.
    What is off is read before the SAE a request asks for, so that a part the model lacks is refused first, as on the
    other routes."""

    @app.get("/api/runs/{name}/sae/{hook}")
    def sae(name: str, hook: str):
        loaded = shelf.get(name)
        return sae_report(shelf.sae(loaded, hook))

    @app.post("/api/token_features")
    def token(req: TokenFeaturesRequest):
        loaded = shelf.get(req.run)
        off = off_for(shelf, loaded, req.off)
        return token_features(shelf, loaded, shelf.sae(loaded, req.hook), req, off)

    @app.post("/api/feature")
    def feature(req: FeatureRequest):
        loaded = shelf.get(req.run)
        off = off_for(shelf, loaded, req.off)
        return feature_report(shelf, loaded, shelf.sae(loaded, req.hook), req, off)


def add_error_handlers(app):
    """Every refusal as the page reads it: a 4xx and {"error": "one line"}, never FastAPI's {"detail": ...}."""

    @app.exception_handler(ApiError)
    def refused(request: Request, e: ApiError):
        return JSONResponse({"error": str(e)}, status_code=e.status)

    @app.exception_handler(UserError)
    def user_error(request: Request, e: UserError):  # what the model refuses to do (a head it lacks): one line
        return JSONResponse({"error": first_line(e)}, status_code=400)

    @app.exception_handler(RequestValidationError)
    def invalid(request: Request, e: RequestValidationError):
        first = e.errors()[0]
        if first["type"] == "json_invalid":
            return JSONResponse({"error": f"the request body is not JSON ({first['ctx']['error']} at character "
                                          f"{first['loc'][-1]})"}, status_code=400)
        where = ".".join(str(part) for part in first["loc"] if part != "body") or "the request body"
        why = first["msg"].removeprefix("Value error, ")  # pydantic's words before a validator's own line
        return JSONResponse({"error": f"{where}: {why}"}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    def http_error(request: Request, e: StarletteHTTPException):
        if e.status_code == 404:
            line = f"nothing at {request.url.path}"
        elif e.status_code == 405:
            line = f"{request.url.path} does not take {request.method} requests"
        else:
            line = body_refused(e) if e.status_code == 400 else str(e.detail)
        return JSONResponse({"error": line}, status_code=e.status_code, headers=e.headers)
