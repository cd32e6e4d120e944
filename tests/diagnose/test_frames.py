"""Where an exception was raised (:mod:`mmddp_ext.diagnose.frames`): the innermost frame, the
user's innermost frame when the raise was deep in a library, the data file it was about; stored by
the real ``record_failure`` and shown by the diagnosis."""
import json

from mmddp_ext.diagnose import summarize
from mmddp_ext.diagnose.frames import (exception_sites, frames_in_text, input_file,
                                       raise_site_lines, raise_sites, worker_error_line)
from mmddp_ext.diagnose.records import read_failures, record_failure

USER = '''
import json

def parse(text):
    return json.loads(text)  # the user's line

def fail():
    raise KeyError('keypoints')  # raised here
'''


def _user_module(tmp_path):
    import importlib.util
    path = tmp_path / 'my_model.py'
    path.write_text(USER)
    spec = importlib.util.spec_from_file_location(f'my_model_{tmp_path.name}', str(path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, str(path)


def _caught(fn, *args):
    try:
        fn(*args)
    except Exception as e:  # noqa: B902 - whatever it raised
        return e
    raise AssertionError('did not raise')


def test_a_raise_deep_in_the_standard_library_names_the_users_line_too(tmp_path):
    mod, path = _user_module(tmp_path)
    sites = exception_sites(_caught(mod.parse, '{"a": '))
    assert sites['raised_at']['file'].endswith('json/decoder.py')
    assert sites['user_at'] == dict(file=path, line=5, func='parse',
                                    source='return json.loads(text)  # the user\'s line')


def test_a_raise_in_the_users_code_is_one_frame(tmp_path):
    mod, path = _user_module(tmp_path)
    sites = exception_sites(_caught(mod.fail))
    assert sites['raised_at']['file'] == path and sites['raised_at']['line'] == 8
    assert sites['raised_at']['source'] == "raise KeyError('keypoints')  # raised here"
    assert sites['user_at'] is None


def test_the_entry_script_alone_is_not_called_the_users_code():
    frames = [
        dict(file='/home/me/tools/train.py', line=3, func='<module>', source='main()'),
        dict(file='/x/site-packages/torch/a.py', line=9, func='f', source='boom()')
    ]
    assert raise_sites(frames) == dict(raised_at=frames[1], user_at=None)
    assert raise_sites([]) == dict(raised_at=None, user_at=None)


def test_without_user_code_the_models_frame_is_named_not_the_frameworks():
    frames = [
        dict(file='/home/me/tools/train.py', line=3, func='<module>', source='main()'),
        dict(file='/x/site-packages/mmengine/runner/loops.py', line=5, func='run_iter',
             source='self.runner.model.train_step(data)'),
        dict(file='/x/site-packages/mmpose/models/heads/heatmap_head.py', line=7, func='forward',
             source='x = self.final_layer(x)'),
        dict(file='/x/site-packages/torch/nn/modules/conv.py', line=9, func='_conv_forward',
             source='return F.conv2d(input, weight)')
    ]
    assert raise_sites(frames)['user_at'] == frames[2]


WORKER_MESSAGE = '''Caught AssertionError in DataLoader worker process 1.
Original Traceback (most recent call last):
  File "/x/site-packages/torch/utils/data/_utils/worker.py", line 349, in _worker_loop
    data = fetcher.fetch(index)
  File "/x/site-packages/mmpose/datasets/transforms/loading.py", line 69, in transform
    raise e
AssertionError: `failed to load image: /data/coco/train/000007.png` occurs when loading it'''


def test_a_dataloader_workers_error_keeps_its_frames_line_and_file():
    frames = frames_in_text(WORKER_MESSAGE)
    assert [f['line'] for f in frames] == [349, 69] and frames[1]['source'] == 'raise e'
    assert worker_error_line(WORKER_MESSAGE).startswith('AssertionError: `failed to load image')
    sites = exception_sites(AssertionError(WORKER_MESSAGE))
    assert sites['raised_at']['file'].endswith('transforms/loading.py')
    assert sites['input_file'] == '/data/coco/train/000007.png'


def test_the_annotation_file_a_parser_was_reading_is_found_in_its_frames(tmp_path):
    bad = tmp_path / 'train.json'
    bad.write_text('{"images": [')

    def load(path):
        with open(path) as f:
            return json.load(f)

    assert input_file(_caught(load, str(bad))) == str(bad)
    assert input_file(_caught(json.loads, '{')) is None  # positive control: no file, none


def test_the_record_and_the_diagnosis_show_where_and_the_file(tmp_path):
    mod, path = _user_module(tmp_path)
    bad = tmp_path / 'ann.json'
    bad.write_text('{')

    def read(p):
        with open(p) as f:
            return mod.parse(f.read())

    work = str(tmp_path / 'w')
    record_failure(work, 1, _caught(read, str(bad)))
    record = read_failures(work)[0]
    assert record['user_at']['line'] == 5 and record['input_file'] == str(bad)
    text = summarize(work, ranks={}, launch=[])
    assert 'raised at ' in text and 'json/decoder.py' in text
    assert f"from your code: {path}:5 in parse: return json.loads(text)" in text
    assert f'input file: {bad} (rank 1, host ' in text
    assert 'fix: the annotation file does not parse' in text


def test_a_missing_file_named_by_a_relative_path_is_shown_whole_with_the_fix(tmp_path, monkeypatch):
    """MMPose's dataset asserts on an annotation file that does not exist, named relative to
    the working directory: the diagnosis names the whole relative path, says that it does not
    exist (not that it is corrupt) and where a relative path is read from."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'data' / 'demo_coco' / 'annotations').mkdir(parents=True)
    error = AssertionError('Annotation file `data/demo_coco/annotations/nope.json`does not exist')
    sites = exception_sites(error)
    assert sites['input_file'] == 'data/demo_coco/annotations/nope.json'
    assert sites['input_missing'] is True and sites['cwd'] == str(tmp_path)
    work = str(tmp_path / 'w')
    record_failure(work, 1, error)
    text = summarize(work, ranks={}, launch=[])
    assert 'input file: data/demo_coco/annotations/nope.json (rank 1, host ' in text
    assert (f"fix: no such file on this node (a relative path: read from the rank's working "
            f"directory {tmp_path}): check the path in the config") in text
    assert 'corrupt' not in text and 'does not parse' not in text
    # positive control: the same message about a file that exists is about its content
    (tmp_path / 'data' / 'demo_coco' / 'annotations' / 'nope.json').write_text('{')
    assert exception_sites(error)['input_missing'] is False


def test_the_packages_own_frames_are_never_the_users_code():
    """A raise deep in MMPose called from our runner: the runner's frame (mmddp_ext/runner/)
    is library code, so the model's frame is named, not ours as "your code"."""
    import mmddp_ext.runner.ddp_runner as ours
    frames = [
        dict(file='/home/me/tools/dist_train.py', line=3, func='<module>', source='main()'),
        dict(file=ours.__file__, line=50, func='build_train_loop', source='loop = ...'),
        dict(file='/x/site-packages/mmpose/datasets/base.py', line=9, func='load_data_list',
             source='assert exists(ann_file)'),
        dict(file='/x/site-packages/mmengine/fileio/io.py', line=7, func='exists',
             source='raise AssertionError'),
    ]
    assert raise_sites(frames)['user_at'] == frames[2]
    # a record that names our frame anyway (written by an older version) does not show it
    lines = raise_site_lines(dict(raised_at=frames[3], user_at=frames[1]))
    assert lines == [f'  raised at {frames[3]["file"]}:7 in exists: raise AssertionError']
