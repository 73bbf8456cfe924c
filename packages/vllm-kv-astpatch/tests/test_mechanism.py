"""The mechanism on synthetic modules: what is preserved, and every way it refuses."""

from __future__ import annotations

import ast
import inspect
import linecache
import sys
import traceback
import types

import pytest
from conftest import MakeModule
from vllm_kv_astpatch import _mechanism
from vllm_kv_astpatch._mechanism import FunctionNode, FunctionTarget, SkipError


def old_to_new(node: FunctionNode) -> int:
    """Test transform: every string constant "old" becomes "new"."""
    changed = 0
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and sub.value == "old":
            sub.value = "new"
            changed += 1
    return changed


def patch(module: types.ModuleType, qualname: str, transform=old_to_new) -> bool:  # type: ignore[no-untyped-def]
    prepared = _mechanism.prepare(FunctionTarget(module.__name__, qualname), transform)
    return _mechanism.install([prepared])


def skip_reason(module: types.ModuleType, qualname: str, transform=old_to_new) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(SkipError) as info:
        _mechanism.prepare(FunctionTarget(module.__name__, qualname), transform)
    return info.value.reason


PRESERVED = '''
import functools

CALLS = []

def register(fn):
    CALLS.append(fn.__name__)  # must not run again when patching
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return ("wrapped", fn(*args, **kwargs))
    return wrapper

class Base:
    def describe(self, tag):
        return "base:" + tag

def make(prefix):
    counter = [0]

    class Child(Base):
        __secret = "hidden"

        @register
        def describe(self, tag="old", *, suffix="!"):
            """Docstring stays."""
            counter[0] += 1
            return (
                prefix,
                super().describe(tag),
                __class__.__name__,
                self.__secret,
                tag + suffix,
                counter[0],
            )

    return Child

Child = make("p")
'''


def test_patch_preserves_closure_decorator_defaults_super_and_mangling(
    make_module: MakeModule,
) -> None:
    mod = make_module(PRESERVED)
    wrapper = mod.Child.__dict__["describe"]
    func = inspect.unwrap(wrapper)
    before = (func.__defaults__, func.__kwdefaults__, func.__closure__, func.__globals__)
    assert mod.Child().describe() == (
        "wrapped",
        ("p", "base:old", "Child", "hidden", "old!", 1),
    )

    assert patch(mod, "Child.describe") is True

    assert mod.CALLS == ["describe"]  # the decorator did not run again
    assert mod.Child.__dict__["describe"] is wrapper
    assert (func.__defaults__, func.__kwdefaults__, func.__closure__, func.__globals__) == before
    assert func.__doc__ == "Docstring stays."
    # defaults are values, not code: the default "old" is kept, the body's constants changed
    assert mod.Child().describe() == (
        "wrapped",
        ("p", "base:old", "Child", "hidden", "old!", 2),
    )
    assert mod.Child().describe("old", suffix="?") == (
        "wrapped",
        ("p", "base:old", "Child", "hidden", "old?", 3),
    )
    assert _mechanism.is_patched(func)


def test_string_constants_in_the_body_change(make_module: MakeModule) -> None:
    mod = make_module(
        """
        class K:
            @staticmethod
            def s():
                return "old"

            @classmethod
            def c(cls):
                return cls.__name__ + "old"

        def free(x=1):
            return "old" * x
        """
    )
    assert patch(mod, "K.s")
    assert patch(mod, "K.c")
    assert patch(mod, "free")
    assert (mod.K.s(), mod.K().c(), mod.free(2)) == ("new", "Knew", "newnew")


def test_line_numbers_stay_those_of_the_file(make_module: MakeModule) -> None:
    mod = make_module(
        """
        def boom():
            x = "old"
            raise ValueError(x)
        """
    )
    line = mod.boom.__code__.co_firstlineno
    assert patch(mod, "boom")
    with pytest.raises(ValueError, match="new") as info:
        mod.boom()
    frame = traceback.extract_tb(info.tb)[-1]
    assert frame.filename == mod.__file__
    assert frame.lineno == line + 2
    assert frame.line == "raise ValueError(x)"


def test_nothing_to_change_is_not_installed(make_module: MakeModule) -> None:
    mod = make_module("def f():\n    return 'other'\n")
    code = mod.f.__code__
    prepared = _mechanism.prepare(FunctionTarget(mod.__name__, "f"), old_to_new)
    assert prepared.patched is None
    assert _mechanism.install([prepared]) is False
    assert mod.f.__code__ is code


def test_second_prepare_sees_the_patch_and_changes_nothing(make_module: MakeModule) -> None:
    mod = make_module("def f():\n    return 'old'\n")
    assert patch(mod, "f")
    code = mod.f.__code__
    again = _mechanism.prepare(FunctionTarget(mod.__name__, "f"), old_to_new)
    assert again.already_applied
    assert _mechanism.install([again]) is False
    assert mod.f.__code__ is code


def test_restore_puts_back_the_original(make_module: MakeModule) -> None:
    mod = make_module("def f():\n    return 'old'\n")
    original = mod.f.__code__
    assert patch(mod, "f")
    assert _mechanism.restore(mod.f) is True
    assert mod.f.__code__ is original
    assert mod.f() == "old"
    assert _mechanism.restore(mod.f) is False


def test_install_is_all_or_nothing(make_module: MakeModule) -> None:
    mod = make_module("def f():\n    return 'old'\n\ndef g():\n    return 'old'\n")
    first = _mechanism.prepare(FunctionTarget(mod.__name__, "f"), old_to_new)
    second = _mechanism.prepare(FunctionTarget(mod.__name__, "g"), old_to_new)
    mod.g.__code__ = (lambda: "someone else").__code__  # changes between prepare and install
    with pytest.raises(SkipError, match="concurrent-change"):
        _mechanism.install([first, second])
    assert mod.f() == "old"
    assert not _mechanism.is_patched(mod.f)


def test_source_unavailable(make_module: MakeModule) -> None:
    mod = make_module("X = 1\n")
    namespace: dict[str, object] = {"__name__": mod.__name__}
    exec(compile("def f():\n    return 'old'\n", "<generated>", "exec"), namespace)
    mod.f = namespace["f"]
    assert skip_reason(mod, "f") == "source-unavailable"
    assert mod.f() == "old"


def test_source_deleted_after_import(make_module: MakeModule) -> None:
    mod = make_module("def f():\n    return 'old'\n")
    linecache.clearcache()
    import os

    os.remove(mod.__file__)
    assert skip_reason(mod, "f") == "source-unavailable"


def test_file_edited_after_import_is_a_mismatch(make_module: MakeModule) -> None:
    mod = make_module("def f():\n    return 'old'\n")
    with open(mod.__file__, "w") as file:
        file.write("def f():\n    return 'old' + 'er'\n")
    assert skip_reason(mod, "f") == "source-mismatch"
    assert mod.f() == "old"


def test_function_replaced_at_run_time_is_a_mismatch(make_module: MakeModule) -> None:
    mod = make_module("def f():\n    return 'old'\n\ndef g():\n    return 'old' * 2\n")
    mod.f.__code__ = mod.g.__code__.replace(co_name="f", co_qualname="f")
    assert skip_reason(mod, "f") == "source-mismatch"


def test_parse_error_in_the_file(make_module: MakeModule) -> None:
    mod = make_module("def f():\n    return 'old'\n")
    with open(mod.__file__, "a") as file:
        file.write("def broken(:\n")
    assert skip_reason(mod, "f") == "parse-error"


def test_missing_targets(make_module: MakeModule) -> None:
    mod = make_module("class K:\n    X = 1\n\nclass Sub(K):\n    pass\n")
    assert skip_reason(mod, "K.nothing") == "target-missing"
    assert skip_reason(mod, "K.X") == "target-missing"
    assert skip_reason(mod, "Nope.f") == "target-missing"
    with pytest.raises(SkipError, match="import-error"):
        _mechanism.prepare(FunctionTarget("no_such_module_here", "f"), old_to_new)


def test_inherited_or_unwrappable_targets(make_module: MakeModule) -> None:
    mod = make_module(
        """
        def opaque(fn):
            def wrapper(*a):
                return fn(*a)
            return wrapper

        class K:
            def f(self):
                return "old"

            @opaque
            def g(self):
                return "old"

        class Sub(K):
            pass
        """
    )
    assert skip_reason(mod, "Sub.f") == "unexpected-target"
    assert skip_reason(mod, "K.g") == "unexpected-target"
    mod.K.f.__wrapped__ = mod.K.f  # a cycle: inspect.unwrap gives up
    assert skip_reason(mod, "K.f") == "unexpected-target"


def test_unexpected_shape(make_module: MakeModule) -> None:
    mod = make_module("def f():\n    return 'old'\n")

    def refuse(node: FunctionNode) -> int:
        raise _mechanism.UnexpectedShapeError("not what I know")

    assert skip_reason(mod, "f", refuse) == "unexpected-ast"


def test_compile_error(make_module: MakeModule) -> None:
    mod = make_module("def f():\n    return 'old'\n")

    def bad(node: FunctionNode) -> int:
        node.body.insert(0, ast.Nonlocal(names=["nowhere"], lineno=2, col_offset=4))
        return 1

    assert skip_reason(mod, "f", bad) == "compile-error"
    assert mod.f() == "old"


def test_closure_mismatch(make_module: MakeModule) -> None:
    mod = make_module(
        """
        def make():
            a = "old"
            b = "other"
            def f():
                return a
            return f

        f = make()
        """
    )

    def use_b_too(node: FunctionNode) -> int:
        use = ast.copy_location(ast.Expr(ast.Name("b", ast.Load())), node.body[0])
        node.body.insert(0, ast.fix_missing_locations(use))
        return 1

    assert skip_reason(mod, "f", use_b_too) == "closure-mismatch"
    assert mod.f() == "old"


def test_same_code_compares_nested_code_and_constant_types() -> None:
    def a() -> object:
        return [x for x in (1, 2)]

    def b() -> object:
        return [x for x in (1, 2.0)]

    def c() -> object:
        return [x for x in (1, 2)]

    assert _mechanism.same_code(a.__code__, c.__code__.replace(co_name="a"))
    assert not _mechanism.same_code(a.__code__, b.__code__.replace(co_name="a"))


def test_find_function_picks_by_first_line() -> None:
    tree = ast.parse(
        "if X:\n    def f():\n        return 1\nelse:\n    def f():\n        return 2\n"
    )
    first = _mechanism.find_function(tree, "f")
    second = _mechanism.find_function(tree, "f", 5)
    assert first is not None
    assert second is not None
    assert (first.lineno, second.lineno) == (2, 5)
    assert _mechanism.find_function(tree, "f", 3) is None


def test_importing_the_package_does_not_import_vllm() -> None:
    import subprocess

    code = "import sys, vllm_kv_astpatch.plugin; print('vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
